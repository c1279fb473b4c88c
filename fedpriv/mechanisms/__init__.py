"""Layer 2: what touches data and noise: noise, clipping, per-sample gradients, Skellam and
lattice noise, local randomizers, record and client samplers, the check-in draw."""
