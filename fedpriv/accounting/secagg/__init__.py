"""Layer 3, family: secure aggregation with several local DP-SGD steps (third paper): its
spec and its lower bound.
"""
