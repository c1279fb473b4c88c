"""The one-run audit's ε lower bound from guess counts, and Andrew et al.'s estimate.

References
----------
Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run", arXiv:2305.08846,
Theorem 3 (approximate DP) and the p-value code of its appendix. Andrew, Kairouz, Oh, Oprea,
McMahan, Suriyakumar, "One-shot Empirical Privacy Estimation for Federated Learning",
arXiv:2302.03098 (Gaussian fit of the canary cosines).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from fedpriv.common.errors import check


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """Probability of ``>= v`` correct guesses out of ``r`` under an (ε, δ)-DP run.

    With ``q = e^ε / (1 + e^ε)`` and ``W' ~ Binomial(r, q)``::

        p = P[W' >= v] + 2 m δ · max_{1 <= i <= v} P[v - i <= W' < v] / i

    Parameters
    ----------
    m : int
        Canaries, each included independently with probability 1/2.
    r : int
        Guesses made (abstentions excluded), ``0 <= r <= m``.
    v : int
        Correct guesses, ``0 <= v <= r``.
    epsilon, delta : float
        The null hypothesis: the run is (ε, δ)-DP, ε >= 0, δ in [0, 1].

    Returns
    -------
    float
        The p-value in [0, 1].

    Raises
    ------
    ConfigError
        For counts or parameters out of range.

    References
    ----------
    Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run", arXiv:2305.08846,
    Theorem 3 and the p-value algorithm of its appendix.
    """
    check(0 <= v <= r <= m, "audit.guesses", (m, r, v), "must satisfy 0 <= v <= r <= m")
    check(epsilon >= 0, "audit.epsilon", epsilon, "must be >= 0")
    check(0 <= delta <= 1, "audit.delta", delta, "must be in [0, 1]")
    q = 1.0 / (1.0 + math.exp(-epsilon)) if epsilon < 700 else 1.0
    tail = float(stats.binom.sf(v - 1, r, q))  # P[W' >= v]
    if delta == 0 or v == 0:
        return min(tail, 1.0)
    i = np.arange(1, v + 1)
    below = stats.binom.sf(v - i - 1, r, q) - tail  # P[v - i <= W' < v]
    alpha = float(np.max(below / i))
    return min(tail + 2.0 * m * delta * max(alpha, 0.0), 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, confidence: float) -> float:
    """The largest ε that ``v`` correct out of ``r`` guesses refute at ``confidence``.

    ``sup {ε >= 0 : p_value(m, r, v, ε, δ) <= 1 - confidence}`` (0 if even ε = 0 is not
    refuted), found by bisection to 1e-6 in ε (the p-value increases with ε).

    Parameters
    ----------
    m, r, v : int
        Canaries, guesses, correct guesses (:func:`p_value`).
    delta : float
        The run's δ (``privacy.target_delta``).
    confidence : float
        1 - β in (0, 1), e.g. 0.95.

    Returns
    -------
    float
        ε_lb >= 0: with probability >= ``confidence`` over the canaries' inclusion, the run
        is not (ε, δ)-DP for any ε < ε_lb.

    Raises
    ------
    ConfigError
        For ``confidence`` outside (0, 1) or counts out of range.

    References
    ----------
    Steinke, Nasr, Jagielski, arXiv:2305.08846, Theorem 3.
    """
    check(0 < confidence < 1, "audit_confidence", confidence, "must be in (0, 1)")
    beta = 1.0 - confidence
    if p_value(m, r, v, 0.0, delta) > beta:
        return 0.0
    lo, hi = 0.0, 1.0
    while p_value(m, r, v, hi, delta) <= beta:
        lo, hi = hi, 2.0 * hi
        if hi > 1e3:  # p-value tends to 1 (v > 0) as ε grows: unreachable for sane counts
            return lo
    while hi - lo > 1e-6:
        mid = 0.5 * (lo + hi)
        if p_value(m, r, v, mid, delta) <= beta:
            lo = mid
        else:
            hi = mid
    return lo


def count_guesses(scores: np.ndarray, included: np.ndarray, k: int) -> tuple[int, int]:
    """``(r, v)``: guess the ``k`` highest ``scores`` "in" and the ``k`` lowest "out".

    Ties are broken by the canary index (a fixed, inclusion-independent order); ``r = 2k``
    (or ``m`` if ``2k > m``).

    Parameters
    ----------
    scores : ndarray, shape (m,)
        Higher means "more likely included".
    included : ndarray of bool, shape (m,)
        The true inclusion.
    k : int
        Guesses on each side, ``>= 0``.
    """
    scores = np.asarray(scores, dtype=np.float64)
    m = len(scores)
    k = min(int(k), m // 2)
    order = np.lexsort((np.arange(m), -np.nan_to_num(scores, nan=-np.inf)))  # best first
    guessed_in, guessed_out = order[:k], order[m - k :] if k else order[:0]
    v = int(np.sum(included[guessed_in])) + int(np.sum(~included[guessed_out]))
    return 2 * k, v


def gaussian_fit_epsilon(in_scores: np.ndarray, out_scores: np.ndarray, delta: float) -> float:
    """Andrew et al.'s point ESTIMATE (not a bound): fit N(μ_in, s_in²), N(μ_out, s_out²) to
    the scores and return the ε at ``delta`` of the Gaussian mechanism with
    ``μ = |μ_in - μ_out| / s_out`` (arXiv:2302.03098, Sec. 4, equal-variance fit)."""
    if len(in_scores) < 2 or len(out_scores) < 2:
        return 0.0
    s = float(np.std(out_scores, ddof=1))
    if not s > 0:
        return math.inf
    mu = abs(float(np.mean(in_scores)) - float(np.mean(out_scores))) / s
    return gaussian_epsilon(mu, delta)


def gaussian_epsilon(mu: float, delta: float) -> float:
    """ε at ``delta`` of μ-GDP: δ(ε) = Φ(-ε/μ + μ/2) - e^ε Φ(-ε/μ - μ/2) (Dong, Roth, Su,
    "Gaussian Differential Privacy", arXiv:1905.02383, Cor. 2.13), by bisection."""
    if mu <= 0:
        return 0.0

    def dlt(eps: float) -> float:
        return float(
            stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
        )

    if dlt(0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while dlt(hi) > delta and hi < 1e3:
        lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if dlt(mid) > delta else (lo, mid)
    return hi
