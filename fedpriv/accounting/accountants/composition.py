"""Composition of a check-in pass's (ε, δ) guarantee over passes, and its inverse.

Several passes (Corollary 3.3 style, fresh check-ins per pass): the best of basic,
advanced (Dwork, Rothblum, Vadhan 2010) and optimal (Kairouz, Oh, Viswanath 2015, Thm 3.3)
composition of the per-pass (eps, delta) guarantee, over a grid of per-pass delta
(:func:`compose_repetitions`); :func:`smallest_delta` inverts an ε(δ) curve.

References
----------
Balle, Bell, Gascon, Kairouz, Thakurta, "Privacy Amplification via Random Check-Ins"
(arXiv:2007.06605), Corollary 3.3; Kairouz, Oh, Viswanath (2015), "The Composition Theorem
for Differential Privacy", Theorem 3.3; Dwork, Rothblum, Vadhan (2010), "Boosting and
Differential Privacy".
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import scipy.special

__all__ = [
    "optimal_composition_delta",
    "advanced_composition_epsilon",
    "COMPOSITION_FRACTIONS",
    "FMT_FRACTIONS",
    "compose_repetitions",
    "smallest_delta",
]


def optimal_composition_delta(
    epsilon: float, delta: float, count: int, total_epsilon: float
) -> float:
    """Exact delta of the ``count``-fold composition of (epsilon, delta)-DP at ``total_epsilon``.

    ``1 - (1 - delta)^k (1 - sum_l C(k,l) [e^{(k-l) eps} - e^{eps_g + l eps}]_+ / (1 + e^eps)^k)``,
    the hockey-stick divergence of ``k`` copies of the canonical (eps, delta) pair, valid at
    every ``eps_g >= 0``. Hypotheses: ``k``-fold (adaptive) composition of mechanisms each
    (eps, delta)-DP under one and the same neighbouring relation (any relation).

    References
    ----------
    Kairouz, Oh, Viswanath (2015), "The Composition Theorem for Differential Privacy",
    arXiv:1311.0776, Theorem 3.3; Murtagh, Vadhan (2016).
    """
    k = int(count)
    if epsilon == 0.0:
        pure = 0.0
    else:
        ls = np.arange(k + 1, dtype=float)
        ok = (k - 2 * ls) * epsilon > total_epsilon
        ls = ls[ok]
        if ls.size == 0:
            pure = 0.0
        else:
            log_binom = (
                scipy.special.gammaln(k + 1)
                - scipy.special.gammaln(ls + 1)
                - scipy.special.gammaln(k - ls + 1)
            )
            log_terms = (
                log_binom
                + (k - ls) * epsilon
                - k * np.logaddexp(0.0, epsilon)
                + np.log(-np.expm1(total_epsilon - (k - 2 * ls) * epsilon))
            )
            top = float(log_terms.max())
            pure = math.exp(top) * float(np.exp(log_terms - top).sum())
    pure = min(max(pure, 0.0), 1.0)
    return float(-np.expm1(k * np.log1p(-delta)) + np.exp(k * np.log1p(-delta)) * pure)


def advanced_composition_epsilon(epsilon: float, count: int, delta_slack: float) -> float:
    """``sqrt(2k ln(1/delta_slack)) eps + k eps (e^eps - 1)`` (Dwork, Rothblum, Vadhan 2010).

    Advanced composition (Dwork, Roth 2014, Theorem 3.20): ``k`` (eps, delta)-DP mechanisms
    compose to (this, ``k delta + delta_slack``)-DP. Hypotheses: (adaptive) composition under
    one and the same neighbouring relation (any relation).
    """
    k = int(count)
    return math.sqrt(2.0 * k * math.log(1.0 / delta_slack)) * epsilon + k * epsilon * math.expm1(
        min(epsilon, 700.0)
    )


def _optimal_composition_epsilon(
    epsilon: float, delta: float, count: int, total_delta: float
) -> float:
    """Smallest total epsilon with :func:`optimal_composition_delta` <= total_delta."""
    if -math.expm1(count * math.log1p(-delta)) >= total_delta:
        return math.inf
    hi = count * epsilon
    if optimal_composition_delta(epsilon, delta, count, 0.0) <= total_delta:
        return 0.0
    lo = 0.0
    while hi - lo > 1e-12 * hi:
        mid = 0.5 * (lo + hi)
        if optimal_composition_delta(epsilon, delta, count, mid) <= total_delta:
            hi = mid
        else:
            lo = mid
    return hi


#: Fractions of ``total_delta / count`` tried as the per-pass delta by :func:`compose_repetitions`.
COMPOSITION_FRACTIONS = tuple(
    float(f) for f in np.concatenate([np.logspace(-4, -1, 7), np.linspace(0.2, 0.9, 8)])
)
#: A coarser grid for expensive per-pass bounds (the FMT21 numerical shuffling bound).
FMT_FRACTIONS = (1e-3, 1e-2, 0.1, 0.3, 0.6, 0.9)


def compose_repetitions(
    pass_epsilon: Callable[[float], float],
    count: int,
    total_delta: float,
    fractions: tuple[float, ...] = COMPOSITION_FRACTIONS,
) -> tuple[float, str]:
    """Best total epsilon of ``count`` passes, each ``(pass_epsilon(d), d)``-DP for any ``d``.

    Tries a grid of per-pass deltas and, for each, basic, advanced and optimal
    composition; returns ``(epsilon, method)``. Every candidate is a valid guarantee, so
    their minimum is too. For ``count = 1`` the "optimal" candidate is the exact
    conversion of one (eps, delta) point to a smaller epsilon at a larger delta.
    ``fractions``: the per-pass deltas tried, as fractions of ``total_delta / count`` (besides
    ``total_delta / count`` itself, for basic composition).

    Theorems: basic composition (Dwork, Roth 2014, Theorem 3.16), advanced composition (their
    Theorem 3.20) and optimal composition (Kairouz, Oh, Viswanath, arXiv:1311.0776, Theorem
    3.3). Hypotheses: each pass is (``pass_epsilon(d)``, ``d``)-DP for every ``d`` under one
    and the same neighbouring relation, with fresh randomness (fresh check-ins) per pass.
    """
    eps_basic = pass_epsilon(total_delta / count)
    best, method = count * eps_basic, ("basic" if count > 1 else "single pass")
    for frac in fractions:
        d_pass = float(frac) * total_delta / count
        eps = pass_epsilon(d_pass)
        if not math.isfinite(eps):
            continue
        slack = total_delta - count * d_pass
        adv = advanced_composition_epsilon(eps, count, slack) if count > 1 else math.inf
        if adv < best:
            best, method = adv, "advanced"
        opt = _optimal_composition_epsilon(eps, d_pass, count, total_delta)
        if opt < best:
            best, method = opt, "optimal"
    return best, method


def smallest_delta(epsilon_at: Callable[[float], float], target_epsilon: float) -> float:
    """Smallest delta in [1e-300, 1) (1e-3 relative, rounded up) with epsilon_at <= target."""

    def ok(log_d: float) -> bool:
        return epsilon_at(math.exp(log_d)) <= target_epsilon

    hi = math.log(0.999999)
    if not ok(hi):
        return 1.0
    lo = math.log(1e-300)
    if ok(lo):
        return 1e-300
    while hi - lo > 1e-3:
        mid = 0.5 * (lo + hi)
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return math.exp(hi)
