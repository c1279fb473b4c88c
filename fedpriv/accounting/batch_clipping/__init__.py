"""Layer 3, family: generalized DP-SGD with shuffling or subsampling and batch clipping
(first paper): its spec and its lower bound.
"""
