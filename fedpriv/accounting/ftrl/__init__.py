"""Layer 3, family: client-level DP-FTRL (matrix-factorized Gaussian) with enforced
participation: its spec and its lower bound.
"""
