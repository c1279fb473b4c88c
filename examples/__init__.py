"""Plug-in examples: your own client algorithm and strategy, selected by ``_target_``."""
