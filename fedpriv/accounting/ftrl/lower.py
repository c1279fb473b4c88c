"""A lower bound on the ε of client-level DP-FTRL, from the noise its stream really generates.

The bound is for the guarantee the run states: any participation set the server's enforcement
allows, gradients chosen adaptively (clipped to C). The noise stream's Gram matrix
``X = (M M^T)^-1`` is materialised from the stream itself (:meth:`Factorization.noise_matrix`,
n <= :data:`~fedpriv.accounting.ftrl.spec.MATERIALIZE_MAX_ROUNDS`), so the bound does not trust the
analytic sensitivity it is compared with.

* unamplified: one client adding the same unit vector in every round of a set ``S``
  (:func:`~fedpriv.mechanisms.mf_sensitivity.attained_sensitivity_squared`) shifts the n
  released rounds by ``||C 1_S||``: the pair is exactly the Gaussian with
  ``μ = sqrt(1_S^T X 1_S) / (z s₁)``, a lower bound on the prefix bound's ``μ_n``.
* amplified (cyclic Poisson, rate q): when the rounds of one group are orthogonal in X
  (BandMF with at most b bands), a client of group g whose gradient is nonzero in its own
  rounds only is released by independent Poisson-sampled Gaussians, one per round ``i`` of
  its group with multiplier ``z s₁ / sqrt(X_ii)``: composed with optimistic PLDs
  (:mod:`fedpriv.accounting.core.lower_bound`). Otherwise no bound (``None``).

References
----------
Choquette-Choo, McMahan, Rush, Thakurta, arXiv:2211.06530, Sec. 2 (the mechanism as a
Gaussian with covariance M M^T); Choquette-Choo et al., arXiv:2306.08153, Sec. 4 (cyclic
Poisson: one group's rounds independent when C has at most b bands).
"""

from __future__ import annotations

import math

import numpy as np
from dp_accounting import dp_event

from fedpriv.accounting.core.privacy_spec import EventRuns
from fedpriv.mechanisms.mf_sensitivity import attained_sensitivity_squared, gram_from_noise_matrix
from fedpriv.mechanisms.participation import Participation

#: Off-diagonal X within one group at most this fraction of its diagonal: independent rounds.
ORTHOGONAL_RTOL = 1e-9


def lower_bound_events(
    noise_matrix: np.ndarray, scale: float, pattern: Participation, amplified: bool
) -> EventRuns | None:
    """Events whose optimistic composition lower-bounds the ε of the n released rounds;
    ``None`` when amplified rounds of one group are not independent.

    Parameters
    ----------
    noise_matrix : np.ndarray
        ``(n, m)`` M materialised from the stream (:meth:`Factorization.noise_matrix`).
    scale : float
        z s₁ > 0: the noise std per unit clipping norm.
    pattern : Participation
        The enforced pattern (cyclic_poisson carries the rate q).
    amplified : bool
        Whether the run is accounted as amplified BandMF.
    """
    gram = gram_from_noise_matrix(noise_matrix)
    n = gram.shape[0]
    if not amplified:
        attained, _ = attained_sensitivity_squared(gram, pattern)
        return [(dp_event.GaussianDpEvent(scale / math.sqrt(attained)), 1)]
    b = pattern.separation
    rate = float(pattern.client_sample_rate or 1.0)
    groups = [np.arange(g, n, b) for g in range(min(b, n))]
    rounds = max(groups, key=lambda s: float(np.diag(gram)[s].sum()))
    block = gram[np.ix_(rounds, rounds)]
    off = block - np.diag(np.diag(block))
    if np.abs(off).max(initial=0.0) > ORTHOGONAL_RTOL * np.diag(block).max():
        return None
    counts: dict[float, int] = {}
    for x_ii in np.diag(block):  # σ rounded UP: a smaller ε, the bound stays valid
        sigma = _round_up(scale / math.sqrt(float(x_ii)))
        counts[sigma] = counts.get(sigma, 0) + 1
    inner = dp_event.PoissonSampledDpEvent
    return [(inner(rate, dp_event.GaussianDpEvent(s)), c) for s, c in sorted(counts.items())]


def _round_up(value: float, digits: int = 9) -> float:
    """``value`` rounded up to ``digits`` significant digits (equal σ's share one event)."""
    exponent = math.floor(math.log10(value)) - digits + 1
    return math.ceil(value / 10.0**exponent) * 10.0**exponent
