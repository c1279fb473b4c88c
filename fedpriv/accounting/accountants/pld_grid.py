"""Composing dp-accounting PLDs that sit on different privacy-loss grids.

dp-accounting composes two PLDs only when both directions share one loss interval. PLDs built
by ``pld-accounting`` (random allocation, truncated windows) each come on a grid of their own,
so before composing, each loss pmf is moved to the coarser of the two intervals: every loss
is rounded UP to the next multiple for an upper bound (pessimistic, δ(ε) can only grow, since
the hockey stick E[(1 − e^(ε − L))₊] increases with every loss L), DOWN for a lower bound.
The error added is at most one interval per composition.

The dominating PLDs built here by pessimistic connect-the-dots (fixed-size cohorts) take a loss
grid RELATIVE to the privacy loss of one occurrence (:func:`relative_interval`): an absolute
grid of 1e-3 against a loss whose spread is 5e-4 (12 of 6,000 clients at z = 7.558) adds 21 %
to ε, while a tenth of the spread costs under 0.2 % at 1, 100, 500 or 5,000 occurrences
(connect-the-dots keeps each occurrence's mean loss, so its error does not pile up with the
count; measured at four (z, γ) pairs). The grid is a function of the event alone, so the
event's PLD, its cache, the ledger and a resumed run all answer the same ε.

Reference: Meiser, Mohammadi, "Tight on budget? Tight bounds for r-fold approximate
differential privacy" (CCS 2018), the rounding of privacy-loss buckets; dp-accounting's own
pessimistic discretization does the same.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

#: The loss grid of an optimistic (lower-bound) PLD unless a caller asks for a finer one.
LOWER_DISCRETIZATION = 1e-4
#: A relative grid is this fraction of one occurrence's root-mean-square privacy loss...
GRID_FRACTION_OF_LOSS = 0.1
#: ...and never finer than this (the loss of one occurrence then spans few points anyway).
FINEST_RELATIVE_GRID = 1e-7


def relative_interval(loss_rms: float, coarsest: float) -> float:
    """The loss grid for an occurrence whose privacy loss has root mean square ``loss_rms``:
    :data:`GRID_FRACTION_OF_LOSS` of it, at most ``coarsest``, at least
    :data:`FINEST_RELATIVE_GRID`. A deterministic function of its arguments, so an event's
    PLD is the same in every ledger and after a resume.

    Parameters
    ----------
    loss_rms : float
        Root mean square of one occurrence's privacy loss (nats), >= 0.
    coarsest : float
        The largest grid allowed (nats).

    Returns
    -------
    float
        The grid (nats), in [FINEST_RELATIVE_GRID, coarsest].
    """
    return max(FINEST_RELATIVE_GRID, min(coarsest, GRID_FRACTION_OF_LOSS * loss_rms))


def sampled_gaussian_loss_rms(sigma: float, rate: float) -> float:
    """The root mean square of the privacy loss of the Gaussian with sensitivity 1 and std
    ``sigma``, Poisson sampled at ``rate`` in (0, 1]: the larger of the remove pair's
    (``L = log(1 − q + q e^((2x − 1)/(2σ²)))``, x from the mixture ``(1 − q) N(0, σ²) +
    q N(1, σ²)``) and the add pair's (``−L``, x from ``N(0, σ²)``), by the trapezoid rule on
    20,001 points over ±12σ (a grid scale: its accuracy does not bear on any bound).

    Parameters
    ----------
    sigma : float
        Noise std per unit of sensitivity, > 0.
    rate : float
        Sampling probability q in (0, 1].

    Returns
    -------
    float
        ``sqrt(max(E_P L², E_Q L²))`` in nats.
    """
    x = np.linspace(-12 * sigma, 12 * sigma + 1, 20_001)
    log_keep = math.log1p(-rate) if rate < 1 else -math.inf
    loss = np.logaddexp(log_keep, math.log(rate) + (2 * x - 1) / (2 * sigma**2))
    base = np.exp(-0.5 * (x / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi))
    shifted = np.exp(-0.5 * ((x - 1) / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi))
    mixture = (1 - rate) * base + rate * shifted
    second = [np.trapezoid(loss**2 * w, x) for w in (mixture, base)]
    return float(math.sqrt(max(second)))


@lru_cache(maxsize=64)
def optimistic_gaussian_pld(
    noise_multiplier: float, sampling_prob: float = 1.0, interval: float = LOWER_DISCRETIZATION
) -> Any:
    """The PLD of the Gaussian with sensitivity 1 and std ``noise_multiplier``, Poisson
    sampled at ``sampling_prob`` (both directions), discretized OPTIMISTICALLY on a loss grid
    of ``interval`` (dp-accounting, no connect-the-dots): its composition gives a lower bound
    on ε, the closer the finer the grid.

    Optimistic discretization (Doroshenko, Ghazi, Kamath, Kumar, Manurangsi,
    arXiv:2207.04380): every loss rounded down, so the PLD is dominated by the pair's.
    Hypotheses: the add/remove relation (both directions of the Poisson-sampled pair); a
    lower bound on a mechanism's ε only where datasets realise this pair in every occurrence
    (:mod:`fedpriv.accounting.core.lower_bound`).
    """
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

    Rounding every loss up keeps a dominating PLD dominating (and down keeps a dominated one
    dominated), and PLDs of independent mechanisms compose by convolution (Doroshenko et al.,
    arXiv:2207.04380). Hypotheses: ``a`` and ``b`` are PLDs of mechanisms run with independent
    randomness under one and the same neighbouring relation, both pessimistic (upper bound)
    or both optimistic (lower bound).
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
    pmfs of one type).

    Moving loss mass up can only raise the hockey-stick divergence at every ε (and down only
    lower it), the rounding of Doroshenko et al. (arXiv:2207.04380). Hypotheses: ``pmf`` is
    one direction of a PLD under the caller's neighbouring relation; pessimistic rounding of
    an upper-bound pmf, optimistic of a lower-bound one.
    """
    dense = pmf.to_dense_pmf()
    probs, lower = dense._probs, int(dense._lower_loss)
    if dense._discretization != interval:
        losses = (np.arange(dense.size) + lower) * dense._discretization
        scaled = losses / interval
        index = (np.ceil(scaled) if pessimistic else np.floor(scaled)).astype(np.int64)
        lower = int(index.min())
        probs = np.bincount(index - lower, weights=probs)
    return pld_pmf.DensePLDPmf(interval, lower, probs, dense._infinity_mass, pessimistic)
