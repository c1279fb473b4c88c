"""Composing dp-accounting PLDs that sit on different privacy-loss grids.

dp-accounting composes two PLDs only when both directions share one loss interval. PLDs built
by ``pld-accounting`` (random allocation, truncated windows) each come on a grid of their own,
so before composing, each loss pmf is moved to the coarser of the two intervals: every loss
is rounded UP to the next multiple for an upper bound (pessimistic, δ(ε) can only grow, since
the hockey stick E[(1 − e^(ε − L))₊] increases with every loss L), DOWN for a lower bound.
The error added is at most one interval per composition.

Reference: Meiser, Mohammadi, "Tight on budget? Tight bounds for r-fold approximate
differential privacy" (CCS 2018), the rounding of privacy-loss buckets; dp-accounting's own
pessimistic discretization does the same.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

#: The loss grid of an optimistic (lower-bound) PLD unless a caller asks for a finer one.
LOWER_DISCRETIZATION = 1e-4


@lru_cache(maxsize=64)
def optimistic_gaussian_pld(
    noise_multiplier: float, sampling_prob: float = 1.0, interval: float = LOWER_DISCRETIZATION
) -> Any:
    """The PLD of the Gaussian with sensitivity 1 and std ``noise_multiplier``, Poisson
    sampled at ``sampling_prob`` (both directions), discretized OPTIMISTICALLY on a loss grid
    of ``interval`` (dp-accounting, no connect-the-dots): its composition gives a lower bound
    on ε, the closer the finer the grid."""
    return pld_lib.from_gaussian_mechanism(
        noise_multiplier,
        pessimistic_estimate=False,
        value_discretization_interval=interval,
        sampling_prob=sampling_prob,
        use_connect_dots=False,
    )


def compose_on_common_grid(a: Any, b: Any, pessimistic: bool = True) -> Any:
    """``a`` composed with ``b`` (dp-accounting ``PrivacyLossDistribution``), both directions
    moved to the coarser loss interval first (rounded up, or down with ``pessimistic=False``).
    """
    remove = _compose(a._pmf_remove, b._pmf_remove, pessimistic)
    add = _compose(a._pmf_add, b._pmf_add, pessimistic)
    return PrivacyLossDistribution(pmf_remove=remove, pmf_add=add)


def _compose(x: Any, y: Any, pessimistic: bool) -> Any:
    step = max(x._discretization, y._discretization)
    return regrid(x, step, pessimistic).compose(regrid(y, step, pessimistic))


def regrid(pmf: Any, interval: float, pessimistic: bool = True) -> Any:
    """The loss pmf as a dense pmf on multiples of ``interval`` (> 0), each loss rounded up
    (``pessimistic``) or down, marked with that estimate type (dp-accounting composes only
    pmfs of one type)."""
    dense = pmf.to_dense_pmf()
    probs, lower = dense._probs, int(dense._lower_loss)
    if dense._discretization != interval:
        losses = (np.arange(dense.size) + lower) * dense._discretization
        scaled = losses / interval
        index = (np.ceil(scaled) if pessimistic else np.floor(scaled)).astype(np.int64)
        lower = int(index.min())
        probs = np.bincount(index - lower, weights=probs)
    return pld_pmf.DensePLDPmf(interval, lower, probs, dense._infinity_mass, pessimistic)
