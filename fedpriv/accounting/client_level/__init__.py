"""Layer 3, family: client-level DP-FedAvg (Poisson, fixed size, random allocation,
adaptive clipping) with Gaussian or Skellam noise.
"""
