"""Numerical amplification by shuffling (Feldman, McMillan, Talwar: "Hiding Among the Clones").

``n`` clients each send one report of an ``eps0``-DP local randomizer; a shuffler releases the
reports in a uniformly random order. Replace-one neighbours. The central guarantee is bounded
by the hockey-stick divergence of the clone pair

``P = alpha A + (1 - alpha) (A + 1)``, ``Q = (1 - alpha) A + alpha (A + 1)``,
``A | c ~ Bin(c, 1/2)``, ``c ~ C = Bin(n - 1, e^-eps0)``, ``alpha = e^eps0 / (e^eps0 + 1)``

(the ``c`` clones of the target among the other ``n - 1`` reports):
``delta(eps) <= max(D_{e^eps}(P || Q), D_{e^eps}(Q || P))`` and
``D = sum_c P[C = c] B(c)`` with ``B(c)`` the divergence given ``c`` (``onestep`` of the
reference code, the paper's ``B``), a closed form in two binomial CDFs.

:func:`shuffle_delta` is the numerical upper bound on that delta, :func:`shuffle_epsilon` the
smallest epsilon it certifies at a target delta (bisection that returns the upper end of its
bracket), :func:`closed_form_epsilon` the paper's closed-form bound.

Port of ``computeamplification.py`` (``onestep``, ``deltacomp``, ``numericalanalysis``,
``closedformanalysis``) of apple/ml-shuffling-amplification (commit 993d285), with these
deliberate differences, each of which keeps (or makes) the result a valid UPPER bound:

* Upper bound only (the reference's ``upperbound=False`` lower bound is not offered).
* ``step = 1``: every value of ``c`` is its own term (the reference's first interval
  ``{ceil(E), ceil(E) + 1}`` keeps its two-point max). With ``step > 1`` the reference bounds
  an interval of ``c`` by the max of ``B`` at its end points, which relies on ``B`` being
  monotone in ``c``; ``step = 1`` needs no such assumption.
* The reference's upper-bound branch takes ``max(deltaq_upperc, deltaq_upperc)`` (a typo for
  ``max(deltaq_upperc, deltaq_lowerc)``): with ``B`` decreasing in ``c`` it under-states the
  ``Q || P`` term of every interval. Fixed here (moot with ``step = 1`` except for the first
  interval, where both end points are used).
* Stopping: the reference stops once the uncovered mass of ``C`` is below both running sums
  and adds it (valid, but up to 2x loose). Here the uncovered mass (computed from the two
  binomial tails, not ``1 - sum``) is added when it is below ``1e-9`` of the larger sum, or
  as soon as the decision ``delta < target`` is settled either way (sum already above the
  target, or sum + uncovered mass below it). Every value returned is
  ``covered terms + uncovered mass``, an upper bound. ``early_stop=True`` restores the
  reference's rule (used by the tests to reproduce the reference's numbers).
* ``B(c)`` is evaluated in a cancellation-free form
  (``e^{eps'} = (e^eps - e^-eps0) / (1 - e^{eps - eps0})``, tails by ``sf``), clamped at 0,
  vectorised over ``c``; exact up to double rounding (a threshold within rounding of an
  integer can move one point whose likelihood ratio is within rounding of ``e^eps``).
* The bisection starts from ``min(eps0, closed form)`` only once the numerical bound
  certifies that start (else from ``eps0``, always valid: the shuffled reports are a
  post-processing of ``n`` ``eps0``-DP reports); it returns the upper end ``rlim``.

References
----------
Feldman, McMillan, Talwar, "Hiding Among the Clones: A Simple and Nearly Optimal Analysis of
Privacy Amplification by Shuffling" (arXiv:2012.12803), Theorem 3.2 (closed form), Section 5
and Appendix E (numerical computation); reference code apple/ml-shuffling-amplification,
``computeamplification.py``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import scipy.special
import scipy.stats

from fedpriv.common.errors import ConfigError, check

__all__ = [
    "FMT_NUMERICAL",
    "DEFAULT_ITERATIONS",
    "closed_form_epsilon",
    "shuffle_delta",
    "shuffle_epsilon",
]

#: Name of the numerical bound in results and CLI output.
FMT_NUMERICAL = "FMT21 numerical"
#: Bisection steps of :func:`shuffle_epsilon`: the result is within ``2^-24`` of its start
#: above the smallest epsilon the numerical bound certifies.
DEFAULT_ITERATIONS = 24
_RTOL = 1e-9  # uncovered mass added once it is below this fraction of the larger sum
_EPS0_MAX = 700.0  # above this e^eps0 overflows; the bound is eps0 itself


# --------------------------------------------------------------------------- validation
def _check_n(num_clients: int) -> int:
    check(
        isinstance(num_clients, (int, np.integer))
        and not isinstance(num_clients, bool)
        and num_clients >= 1,
        "num_clients",
        num_clients,
        "must be an integer >= 1",
    )
    return int(num_clients)


def _check_eps0(local_epsilon: float) -> float:
    try:
        e0 = float(local_epsilon)
    except (TypeError, ValueError):
        raise ConfigError("local_epsilon", local_epsilon, "must be a finite number > 0") from None
    check(
        math.isfinite(e0) and e0 > 0, "local_epsilon", local_epsilon, "must be a finite number > 0"
    )
    return e0


def _check_delta(delta: float) -> float:
    try:
        d = float(delta)
    except (TypeError, ValueError):
        raise ConfigError("delta", delta, "must be in (0, 1)") from None
    check(0.0 < d < 1.0, "delta", delta, "must be in (0, 1)")
    return d


# --------------------------------------------------------------------------- closed form
def closed_form_epsilon(num_clients: int, local_epsilon: float, delta: float) -> float:
    """The closed-form central epsilon of shuffling ``n`` ``eps0``-DP reports.

    As the reference's ``closedformanalysis``: for ``eps0 <= ln(n / (16 ln(4/delta)))``,
    ``eps = ln(1 + (b/d)(a + c))`` with ``a = 8 sqrt(e^eps0 ln(4/delta) / n)``,
    ``c = 8 e^eps0 / n``, ``b = 1 - e^-eps0``, ``d = 1 + e^{-eps0 - ln(1 + a + c)}``;
    outside that regime ``eps0`` (the trivial bound). Never above ``eps0``.

    Hypotheses (Feldman, McMillan, Talwar, arXiv:2012.12803): the replace-one relation (one
    client's report changes); each of the ``n`` clients sends exactly one report of an
    ``eps0``-DP local randomizer (pure ``eps0``, for every pair of inputs); the shuffler is
    trusted and its permutation uniform and independent of the reports.

    Parameters
    ----------
    num_clients : int
        ``n >= 1``, the number of shuffled reports.
    local_epsilon : float
        ``eps0 > 0``.
    delta : float
        Target delta in (0, 1).

    Returns
    -------
    float
        Central epsilon (natural log units).

    Raises
    ------
    ConfigError
        ``num_clients``, ``local_epsilon`` or ``delta`` out of range (one line).

    References
    ----------
    Feldman, McMillan, Talwar (arXiv:2012.12803), Theorem 3.2, as computed by
    apple/ml-shuffling-amplification ``closedformanalysis``.
    """
    n, e0, d = _check_n(num_clients), _check_eps0(local_epsilon), _check_delta(delta)
    log_term = math.log(4.0 / d)
    ratio = n / (16.0 * log_term)
    if e0 > _EPS0_MAX or ratio <= 1.0 or e0 > math.log(ratio):
        return e0
    a = 8.0 * math.sqrt(math.exp(e0) * log_term) / math.sqrt(n)
    c = 8.0 * math.exp(e0) / n
    e = math.log1p(a + c)
    b = -math.expm1(-e0)
    dd = 1.0 + math.exp(-e0 - e)
    return min(math.log1p((b / dd) * (a + c)), e0)


# --------------------------------------------------------------------------- the divergence
def _onestep(c: np.ndarray, eps: float, eps0: float) -> tuple[np.ndarray, np.ndarray]:
    """``B(c)`` both ways: ``(D_{e^eps}(P_c || Q_c), D_{e^eps}(Q_c || P_c))``, ``0 <= eps < eps0``.

    ``P_c = alpha Bin(c, 1/2) + (1 - alpha)(Bin(c, 1/2) + 1)``, ``Q_c`` with ``alpha`` and
    ``1 - alpha`` swapped. ``P_c(x) / Q_c(x) > e^eps`` exactly for
    ``x < (c + 1) / (e^{eps'} + 1)`` (and ``Q_c / P_c > e^eps`` for ``x > (c + 1) /
    (e^{-eps'} + 1)``), ``e^{eps'} = (e^eps - e^-eps0) / (1 - e^{eps - eps0})``.
    """
    alpha = float(scipy.special.expit(eps0))
    beta = float(scipy.special.expit(-eps0))  # 1 - alpha
    ex = math.exp(eps)
    ratio = (ex - math.exp(-eps0)) / -math.expm1(eps - eps0)  # e^{eps'} > 0
    c1 = c + 1.0
    kp = np.floor(c1 / (ratio + 1.0))
    kq = np.floor(c1 * ratio / (ratio + 1.0))
    cdf = scipy.stats.binom.cdf
    sf = scipy.stats.binom.sf
    f0, f1 = cdf(kp, c, 0.5), cdf(kp - 1.0, c, 0.5)
    dp = (alpha * f0 + beta * f1) - ex * (beta * f0 + alpha * f1)
    s0, s1 = sf(kq, c, 0.5), sf(kq - 1.0, c, 0.5)
    dq = (beta * s0 + alpha * s1) - ex * (alpha * s0 + beta * s1)
    return np.maximum(dp, 0.0), np.maximum(dq, 0.0)


@dataclass(frozen=True)
class _Layout:
    """The reference's intervals of ``c`` in its order, and what does not depend on eps.

    ``lower``/``upper``: the interval (``up_1 = {c0, c0 + 1}``, ``up_B = {c0 + B}``,
    ``down_B = {c0 - B}``, ``c0 = ceil((n - 1) e^-eps0)``, interleaved ``up_1, down_1, up_2,
    ...``, out-of-range ones skipped); ``mass``: ``P[C in interval]``; ``rem``: the mass of
    ``C`` outside everything covered up to and including the interval (binomial tails);
    ``rem_ref``: the reference's ``1 - sum of masses``. Truncated once ``rem`` is 0 in double
    precision, or ``64 sigma`` from the mean (what is cut is charged as ``rem``).
    """

    lower: np.ndarray
    upper: np.ndarray
    mass: np.ndarray
    rem: np.ndarray
    rem_ref: np.ndarray
    sigma: float


@functools.lru_cache(maxsize=8)  # a layout holds O(sigma) arrays (1M entries at n = 1e9)
def _layout(n: int, eps0: float) -> _Layout:
    p = math.exp(-eps0)
    dist = scipy.stats.binom(n - 1, p)
    mean = (n - 1) * p
    c0 = min(math.ceil(mean), n - 1)
    # the reference's B = 1 .. ceil(n / step) - 1 with step = 1, cut where the binomial
    # tails are far below any delta of interest (what is cut is charged as uncovered mass)
    sigma = math.sqrt(max(mean * (1.0 - p), 1.0))
    b = np.arange(1, min(n, int(64 * sigma) + 256))
    up, down = c0 + b, c0 - b
    lower = np.stack([np.where(b == 1, c0, up), down], axis=1).ravel()
    upper = np.stack([np.minimum(up, n - 1), down], axis=1).ravel()
    is_up = np.tile([True, False], b.size)
    keep = np.where(is_up, lower <= n - 1, upper >= 0)
    lower, upper, is_up = lower[keep], upper[keep], is_up[keep]
    mass = np.where(
        lower > mean,
        dist.sf(lower - 1) - dist.sf(upper),
        dist.cdf(upper) - dist.cdf(lower - 1),
    )
    mass = np.maximum(mass, 0.0)
    cover_hi = np.maximum.accumulate(np.where(is_up, upper, c0 - 1))
    cover_lo = np.minimum.accumulate(np.where(is_up, c0, lower))
    rem = np.maximum(dist.cdf(cover_lo - 1) + dist.sf(cover_hi), 0.0)
    zero = np.flatnonzero(rem == 0.0)
    end = int(zero[0]) + 1 if zero.size else lower.size
    rem_ref = 1.0 - np.cumsum(mass[:end])
    return _Layout(lower[:end], upper[:end], mass[:end], rem[:end], rem_ref, sigma)


def _delta_upper(
    n: int, eps0: float, eps: float, target: float | None, early_stop: bool = False
) -> float:
    """Upper bound on ``delta(eps)`` of shuffling (the reference's ``deltacomp``, step 1).

    ``target``: the bisection's delta; the sum stops as soon as ``delta < target`` is decided
    and returns ``target`` itself when the covered sum exceeds it (as the reference's
    ``deltaupper``). ``None``: the value itself (to ``1e-9`` relative, rounded up).
    Every value returned is the covered terms plus the uncovered mass of ``C``.
    """
    if eps >= eps0:
        return 0.0
    if n == 1:
        return 1.0  # no clones: trivially bounded (callers return eps0 themselves)
    cap = math.inf if target is None else target
    lay = _layout(n, eps0)
    dp = dq = 0.0
    start, size = 0, int(8 * lay.sigma) + 32
    total = lay.lower.size
    while start < total:
        sl = slice(start, min(start + size, total))
        lower, upper = lay.lower[sl], lay.upper[sl]
        cs = np.unique(np.concatenate([lower, upper])).astype(float)
        vp, vq = _onestep(cs, eps, eps0)
        at_l, at_u = np.searchsorted(cs, lower), np.searchsorted(cs, upper)
        mass = lay.mass[sl]
        sum_p = dp + np.cumsum(mass * np.maximum(vp[at_l], vp[at_u]))
        sum_q = dq + np.cumsum(mass * np.maximum(vq[at_l], vq[at_u]))
        top = np.maximum(sum_p, sum_q)
        if early_stop:  # the reference's rule: stop once the rest is below both sums
            rem = np.maximum(lay.rem_ref[sl], 0.0)
            stop = (top > cap) | ((rem < sum_p) & (rem < sum_q))
        else:
            rem = lay.rem[sl]
            stop = (rem <= _RTOL * top) | (rem == 0.0)
            if target is not None:  # the bisection's question is settled either way
                stop |= (top > cap) | (top + rem < cap)
        hits = np.flatnonzero(stop)
        if hits.size:
            k = int(hits[0])
            return cap if top[k] > cap else float(top[k] + rem[k])
        dp, dq = float(sum_p[-1]), float(sum_q[-1])
        start += size
        size *= 2
    rem_end = float(lay.rem[-1]) if total else 1.0
    return max(dp, dq) + rem_end


def shuffle_delta(num_clients: int, local_epsilon: float, epsilon: float) -> float:
    """Numerical upper bound on the central delta at ``epsilon`` of shuffling ``n`` reports.

    Hypotheses (Feldman, McMillan, Talwar, arXiv:2012.12803): the replace-one relation (one
    client's report changes); each of the ``n`` clients sends exactly one report of an
    ``eps0``-DP local randomizer (pure ``eps0``, for every pair of inputs); the shuffler is
    trusted and its permutation uniform and independent of the reports.

    Parameters
    ----------
    num_clients : int
        ``n >= 1`` reports, each from an ``eps0``-DP local randomizer.
    local_epsilon : float
        ``eps0 > 0``.
    epsilon : float
        Central epsilon ``>= 0`` (0 delta at ``epsilon >= eps0``).

    Returns
    -------
    float
        ``delta`` in [0, 1]: covered terms of the clone divergence plus the uncovered mass
        (uncovered mass below ``1e-9`` of the result), and never above the trivial
        ``1 - e^{eps - eps0}`` of one ``eps0``-DP release (the value for ``n = 1``).

    Raises
    ------
    ConfigError
        Out-of-range arguments (one line).

    References
    ----------
    Feldman, McMillan, Talwar (arXiv:2012.12803), Appendix E (``M_1``; ``deltacomp`` of
    apple/ml-shuffling-amplification).
    """
    n, e0 = _check_n(num_clients), _check_eps0(local_epsilon)
    try:
        eps = float(epsilon)
    except (TypeError, ValueError):
        raise ConfigError("epsilon", epsilon, "must be a finite number >= 0") from None
    check(math.isfinite(eps) and eps >= 0, "epsilon", epsilon, "must be a finite number >= 0")
    if eps >= e0:
        return 0.0
    trivial = -math.expm1(eps - e0)  # any eps0-DP release: delta(eps) <= 1 - e^{eps - eps0}
    if e0 > _EPS0_MAX or n == 1:
        return trivial
    return min(trivial, _delta_upper(n, e0, eps, None))


@functools.lru_cache(maxsize=4096)
def _epsilon(n: int, e0: float, delta: float, num_iterations: int, early_stop: bool) -> float:
    if e0 > _EPS0_MAX or n == 1:
        return e0
    start = closed_form_epsilon(n, e0, delta)
    upper = e0
    if start < e0 and _delta_upper(n, e0, start, delta, early_stop) < delta:
        upper = start  # certified by the numerical bound itself
    lo, hi = 0.0, upper
    for _ in range(num_iterations):
        mid = 0.5 * (lo + hi)
        if _delta_upper(n, e0, mid, delta, early_stop) < delta:
            hi = mid
        else:
            lo = mid
    return hi


def shuffle_epsilon(
    num_clients: int,
    local_epsilon: float,
    delta: float,
    num_iterations: int = DEFAULT_ITERATIONS,
    *,
    early_stop: bool = False,
) -> float:
    """Numerical upper bound on the central epsilon of shuffling ``n`` ``eps0``-DP reports.

    Bisection on ``[0, start]`` (``start``: the closed form when the numerical bound certifies
    it, else ``eps0``) for the smallest epsilon with :func:`shuffle_delta` below ``delta``;
    returns the upper end of the final bracket, so the result is always certified (or
    ``eps0``).

    Hypotheses (Feldman, McMillan, Talwar, arXiv:2012.12803): the replace-one relation (one
    client's report changes); each of the ``n`` clients sends exactly one report of an
    ``eps0``-DP local randomizer (pure ``eps0``, for every pair of inputs); the shuffler is
    trusted and its permutation uniform and independent of the reports.

    Parameters
    ----------
    num_clients : int
        ``n >= 1``.
    local_epsilon : float
        ``eps0 > 0`` (above 700: ``eps0`` is returned).
    delta : float
        Target delta in (0, 1).
    num_iterations : int
        Bisection steps (>= 1); the result is at most ``start 2^-num_iterations`` above the
        smallest certified epsilon.
    early_stop : bool
        The reference's stopping rule for the sum over clones (looser; for comparisons).

    Returns
    -------
    float
        Central epsilon in ``[0, eps0]``.

    Raises
    ------
    ConfigError
        ``num_clients < 1``, ``local_epsilon <= 0`` or non-finite, ``delta`` outside (0, 1),
        ``num_iterations < 1`` (one line).

    References
    ----------
    Feldman, McMillan, Talwar (arXiv:2012.12803), Appendix E; ``numericalanalysis`` of
    apple/ml-shuffling-amplification (``upperbound=True``).
    """
    n, e0, d = _check_n(num_clients), _check_eps0(local_epsilon), _check_delta(delta)
    check(
        isinstance(num_iterations, (int, np.integer)) and num_iterations >= 1,
        "num_iterations",
        num_iterations,
        "must be an integer >= 1",
    )
    return _epsilon(n, e0, d, int(num_iterations), bool(early_stop))
