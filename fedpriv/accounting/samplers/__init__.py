"""Layer 3, samplers: amplification operators applied to a mechanism's loss: fixed-size
cohorts (replace-one), random allocation (k of t), shuffling, random check-in slots.
"""
