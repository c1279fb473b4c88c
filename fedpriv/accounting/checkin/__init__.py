"""Layer 3, family: random check-ins (second paper): local randomizers (spec, events,
lower bound) and central Gaussian slot sums.
"""
