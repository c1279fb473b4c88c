"""Gaussian differential privacy (f-DP) toolkit: G_mu, composition, exact profiles, mixtures,
and the exact accountant of Gaussian releases without sampling
(:class:`ExactGaussianAccountant`).

Everything here is exact up to floating point: the privacy profile of ``G_mu`` is a closed
form, its inverse is found by root finding on the log scale, and every inverse is checked on
the returned value so that the reported epsilon is never below the true one.

References
----------
Dong, Roth, Su (2019), "Gaussian Differential Privacy", arXiv:1905.02383: Definition 2.7
(G_mu), Corollary 2.13 (profile of G_mu), Corollary 3.3 (composition), Theorem 2.14 (group).
Balle, Wang (2018), "Improving the Gaussian Mechanism for Differential Privacy: Analytical
Calibration and Optimal Denoising", ICML, Theorem 8 (analytic Gaussian mechanism).
van Dijk et al., "Generalizing DP-SGD with Shuffling and Batch Clipping", arXiv:2212.05796:
Lemma B.1 / eq. (6) (mixture of G_mu's with the component revealed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import numpy as np
import scipy.optimize
import scipy.special
from dp_accounting import dp_event
from numpy.typing import ArrayLike

from fedpriv.accounting.core.accountant import AccountingSettings, Runs
from fedpriv.common.errors import ConfigError, check

__all__ = [
    "gdp_tradeoff",
    "compose_mu",
    "group_mu",
    "gdp_log_delta",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
    "mixture_delta",
    "mixture_epsilon",
    "analytic_gaussian_sigma",
    "noise_for_mu",
    "gaussian_noise_multiplier",
    "gaussian_mu",
    "ExactGaussianAccountant",
]

_SQRT2 = math.sqrt(2.0)
_LOG_HALF = math.log(0.5)
#: Relative safety margin on delta in every inversion (covers exp/log rounding).
_MARGIN = 1e-12


# --------------------------------------------------------------------------- validation
def _check_mu(mu: float, field: str = "mu") -> float:
    mu = float(mu)
    check(not math.isnan(mu) and mu >= 0.0, field, mu, "must be >= 0")
    return mu


def _check_delta(delta: float, field: str = "target_delta") -> float:
    delta = float(delta)
    check(0.0 < delta < 1.0, field, delta, "must be in (0, 1)")
    return delta


def _check_epsilon(epsilon: float, field: str = "target_epsilon") -> float:
    epsilon = float(epsilon)
    check(not math.isnan(epsilon) and epsilon >= 0.0, field, epsilon, "must be >= 0")
    return epsilon


# --------------------------------------------------------------------------- G_mu basics
def gdp_tradeoff(alpha: ArrayLike, mu: float) -> np.ndarray:
    """Gaussian trade-off function ``G_mu(alpha) = Phi(Phi^{-1}(1 - alpha) - mu)``.

    Parameters
    ----------
    alpha : array_like
        Type I error(s) in [0, 1], any shape.
    mu : float
        GDP parameter, >= 0 (``inf`` gives the trade-off 0 of a non-private mechanism).

    Returns
    -------
    numpy.ndarray
        Type II errors, same shape as ``alpha``.

    Raises
    ------
    ConfigError
        If ``mu < 0`` or some ``alpha`` is outside [0, 1].

    References
    ----------
    Dong, Roth, Su (2019), arXiv:1905.02383, Definition 2.7. Hypotheses: none of its own (a
    definition); a mechanism is ``G_mu``-DP under a stated neighbouring relation, and every
    bound derived from this curve holds for that relation only.
    """
    mu = _check_mu(mu)
    a = np.asarray(alpha, dtype=float)
    check(bool(np.all((a >= 0) & (a <= 1))), "alpha", alpha, "must be in [0, 1]")
    if math.isinf(mu):
        return np.where(a > 0, 0.0, 1.0)
    # Phi(Phi^{-1}(1-a) - mu) = ndtr(-ndtri(a) - mu), accurate for small a.
    return np.asarray(scipy.special.ndtr(-scipy.special.ndtri(a) - mu), dtype=float)


def compose_mu(mus: Iterable[float]) -> float:
    """Composition ``G_mu1 (x) ... (x) G_muT = G_mu`` with ``mu = sqrt(sum mu_i^2)``.

    Raises
    ------
    ConfigError
        If some ``mu_i < 0``.

    References
    ----------
    Dong, Roth, Su (2019), arXiv:1905.02383, Corollary 3.3. Hypotheses: (adaptive)
    composition of mechanisms each ``G_mu_i``-DP under one and the same neighbouring relation.
    """
    values = [_check_mu(m) for m in mus]
    return float(math.sqrt(math.fsum(m * m for m in values)))


def group_mu(mu: float, group_size: int) -> float:
    """Group privacy: a ``G_mu``-DP mechanism is ``G_{g mu}``-DP for groups of ``g`` records.

    Raises
    ------
    ConfigError
        If ``mu < 0`` or ``group_size < 1``.

    References
    ----------
    Dong, Roth, Su (2019), arXiv:1905.02383, Theorem 2.14. Hypotheses: ``G_mu``-DP for datasets
    at distance 1, and datasets at distance ``g`` joined by ``g`` such steps (true for the
    replace-one relation, and for add/remove between datasets ``g`` additions apart).
    """
    mu = _check_mu(mu)
    check(
        int(group_size) == group_size and group_size >= 1,
        "group_privacy",
        group_size,
        "must be an integer >= 1",
    )
    return float(group_size) * mu


# --------------------------------------------------------------------------- profile of G_mu
def _log_delta_array(eps: np.ndarray, mu: np.ndarray) -> np.ndarray:
    """Elementwise ``log delta_{G_mu}(eps)`` for finite ``mu > 0`` and ``eps >= 0``.

    ``delta = Phi(a) - e^eps Phi(b)`` with ``a = -eps/mu + mu/2`` and ``b = a - mu``.
    For ``a < 0`` the identity ``eps - b^2/2 = -a^2/2`` gives
    ``delta = exp(-a^2/2)/2 * (erfcx(-a/sqrt2) - erfcx(-b/sqrt2))``, which avoids the
    cancellation between two tiny numbers. For ``a >= 0`` the log_ndtr form is used.
    """
    a = -eps / mu + mu / 2.0
    b = a - mu
    out = np.empty_like(a)
    neg = a < 0
    if np.any(neg):
        an, bn = a[neg], b[neg]
        diff = scipy.special.erfcx(-an / _SQRT2) - scipy.special.erfcx(-bn / _SQRT2)
        with np.errstate(divide="ignore"):
            out[neg] = _LOG_HALF - an * an / 2.0 + np.log(np.maximum(diff, 0.0))
    pos = ~neg
    if np.any(pos):
        la = scipy.special.log_ndtr(a[pos])
        lb = eps[pos] + scipy.special.log_ndtr(b[pos])
        with np.errstate(divide="ignore"):
            out[pos] = la + np.log(np.maximum(-np.expm1(lb - la), 0.0))
    return np.asarray(out, dtype=float)


def gdp_log_delta(epsilon: ArrayLike, mu: float | ArrayLike) -> np.ndarray:
    """Natural log of the exact privacy profile ``delta_{G_mu}(epsilon)``.

    Parameters
    ----------
    epsilon : array_like
        epsilon >= 0, any shape (broadcast against ``mu``).
    mu : float or array_like
        GDP parameter(s) >= 0; ``0`` gives ``-inf`` (delta 0), ``inf`` gives 0 (delta 1).

    Returns
    -------
    numpy.ndarray
        ``log delta`` (``-inf`` where delta underflows or is exactly 0).

    References
    ----------
    Dong, Roth, Su (2019), arXiv:1905.02383, Corollary 2.13:
    ``delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``. Hypotheses: the
    mechanism is ``G_mu``-DP under some neighbouring relation; the profile holds for it.
    """
    eps_arr, mu_arr = np.broadcast_arrays(np.asarray(epsilon, float), np.asarray(mu, float))
    eps_arr = np.array(eps_arr, dtype=float)
    mu_arr = np.array(mu_arr, dtype=float)
    check(bool(np.all(eps_arr >= 0)), "epsilon", epsilon, "must be >= 0")
    check(bool(np.all(mu_arr >= 0)), "mu", mu, "must be >= 0")
    out = np.full(eps_arr.shape, -np.inf)
    out[np.isinf(mu_arr)] = 0.0
    finite = (mu_arr > 0) & np.isfinite(mu_arr) & np.isfinite(eps_arr)
    if np.any(finite):
        out[finite] = _log_delta_array(eps_arr[finite], mu_arr[finite])
    return np.asarray(np.minimum(out, 0.0), dtype=float)


def gdp_delta(epsilon: ArrayLike, mu: float | ArrayLike) -> np.ndarray | float:
    """Exact privacy profile ``delta_{G_mu}(epsilon)`` (see :func:`gdp_log_delta`).

    Returns a float for scalar input, an array otherwise. Dong, Roth, Su, arXiv:1905.02383,
    Corollary 2.13; hypotheses: a ``G_mu``-DP mechanism under some neighbouring relation
    (the profile holds for that relation).
    """
    out = np.exp(gdp_log_delta(epsilon, mu))
    return float(out) if out.ndim == 0 else out


def _solve_decreasing(
    log_f: Callable[[float], float], log_target: float, hi_start: float = 1.0
) -> float:
    """Smallest ``x >= 0`` with ``log_f(x) <= log_target`` for a decreasing ``log_f``.

    Brackets by doubling, refines with Brent's method on the log scale, then moves the
    answer up until the inequality holds at the returned point (never under-reports).
    """
    log_target -= _MARGIN
    if log_f(0.0) <= log_target:
        return 0.0
    lo, hi = 0.0, hi_start
    while log_f(hi) > log_target:
        lo, hi = hi, 2.0 * hi
        if hi > 1e12:
            return math.inf
    x = scipy.optimize.brentq(
        lambda e: log_f(e) - log_target, lo, hi, xtol=1e-14, rtol=1e-13, maxiter=500
    )
    step = max(abs(x) * 1e-13, 1e-15)
    while log_f(x) > log_target:
        x += step
        step *= 2.0
    return float(x)


def gdp_epsilon(target_delta: float, mu: float) -> float:
    """Smallest epsilon with ``delta_{G_mu}(epsilon) <= target_delta``.

    Parameters
    ----------
    target_delta : float
        In (0, 1).
    mu : float
        GDP parameter >= 0.

    Returns
    -------
    float
        epsilon >= 0; ``0`` for ``mu = 0`` or when ``delta(0) <= target_delta``;
        ``inf`` only for ``mu = inf``.

    Raises
    ------
    ConfigError
        If ``target_delta`` is not in (0, 1) or ``mu < 0``.

    References
    ----------
    Dong, Roth, Su (2019), arXiv:1905.02383, Corollary 2.13 (the profile inverted; the root
    is moved up until the profile meets ``target_delta``). Hypotheses: a ``G_mu``-DP
    mechanism under some neighbouring relation (the ε holds for that relation).
    """
    target_delta = _check_delta(target_delta)
    mu = _check_mu(mu)
    if mu == 0.0:
        return 0.0
    if math.isinf(mu):
        return math.inf
    if mu > 1e6:
        # δ(ε) ≤ Φ(−ε/μ + μ/2), so ε = μ²/2 + μ Φ⁻¹(1−δ) is a valid (tight as μ → ∞) upper
        # bound; it overflows to inf only where no double can hold the answer.
        with np.errstate(over="ignore"):
            return float(mu * mu / 2.0 + mu * float(scipy.special.ndtri(1.0 - target_delta)))
    log_t = math.log(target_delta)
    return _solve_decreasing(
        lambda e: float(gdp_log_delta(e, mu)), log_t, hi_start=max(1.0, mu * mu / 2.0 + mu)
    )


def gdp_mu(target_epsilon: float, target_delta: float) -> float:
    """Largest ``mu`` with ``delta_{G_mu}(target_epsilon) <= target_delta``.

    The profile is increasing in ``mu``; the root is refined and then nudged down so that
    the inequality holds at the returned value.

    Raises
    ------
    ConfigError
        If ``target_epsilon < 0`` or ``target_delta`` not in (0, 1).

    References
    ----------
    Dong, Roth, Su (2019), arXiv:1905.02383, Corollary 2.13 (every ``G_mu`` with this ``mu``
    or less is (``target_epsilon``, ``target_delta``)-DP). Hypotheses: the relation under
    which the mechanism is ``G_mu``-DP (any).
    """
    eps = _check_epsilon(target_epsilon)
    log_t = math.log(_check_delta(target_delta)) - _MARGIN

    def g(m: float) -> float:
        return float(gdp_log_delta(eps, m)) - log_t

    lo, hi = 0.0, 1.0
    while g(hi) <= 0.0:
        lo, hi = hi, 2.0 * hi
    mu = scipy.optimize.brentq(g, lo, hi, xtol=1e-15, rtol=1e-14, maxiter=500)
    step = max(mu * 1e-13, 1e-16)
    while mu > 0 and g(mu) > 0.0:
        mu = max(mu - step, 0.0)
        step *= 2.0
    return float(mu)


# --------------------------------------------------------------------------- mixtures
def _mixture_arrays(mus: ArrayLike, weights: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    mu_arr = np.asarray(mus, dtype=float).ravel()
    w_arr = np.asarray(weights, dtype=float).ravel()
    check(
        mu_arr.shape == w_arr.shape and mu_arr.size > 0,
        "weights",
        w_arr.size,
        f"must match the {mu_arr.size} mixture components",
    )
    check(bool(np.all(mu_arr >= 0)), "mus", mus, "must all be >= 0")
    check(bool(np.all(w_arr >= 0)), "weights", weights, "must all be >= 0")
    total = float(w_arr.sum())
    check(abs(total - 1.0) < 1e-9, "weights", total, "must sum to 1 (a distribution)")
    keep = w_arr > 0
    return mu_arr[keep], w_arr[keep]


def _mixture_log_delta(eps: float, mu_arr: np.ndarray, log_w: np.ndarray) -> float:
    terms = log_w + gdp_log_delta(np.full(mu_arr.shape, eps), mu_arr)
    return float(min(scipy.special.logsumexp(terms), 0.0))


def mixture_delta(epsilon: float, mus: ArrayLike, weights: ArrayLike) -> float:
    """Profile of a Gaussian mixture whose component is revealed to the adversary.

    With probability ``weights[i]`` the mechanism is ``G_{mus[i]}``-DP and the adversary may
    learn ``i``; the privacy profile is ``delta(eps) = sum_i weights[i] delta_{G_{mus[i]}}(eps)``.

    Parameters
    ----------
    epsilon : float
        >= 0.
    mus : array_like, shape (K,)
        Component GDP parameters, >= 0 (``inf`` allowed: a non-private component).
    weights : array_like, shape (K,)
        Probabilities, >= 0, summing to 1 (within 1e-9).

    Returns
    -------
    float
        delta in [0, 1].

    Raises
    ------
    ConfigError
        On negative or mismatched inputs or weights not summing to 1.

    References
    ----------
    van Dijk et al., "Generalizing DP-SGD with Shuffling and Batch Clipping",
    arXiv:2212.05796, Lemma B.1 / eq. (6). Hypotheses: under one neighbouring relation, the
    law of the component ``i`` is the same for both datasets and, given ``i``, the mechanism
    is ``G_{mus[i]}``-DP; revealing ``i`` only helps the adversary, so the profile is an
    upper bound on the mechanism's.
    """
    eps = _check_epsilon(epsilon, "epsilon")
    mu_arr, w_arr = _mixture_arrays(mus, weights)
    return math.exp(_mixture_log_delta(eps, mu_arr, np.log(w_arr)))


def mixture_epsilon(target_delta: float, mus: ArrayLike, weights: ArrayLike) -> float:
    """Smallest epsilon with ``mixture_delta(epsilon, mus, weights) <= target_delta``.

    Returns ``inf`` only when the weight of non-private components (``mu = inf``) exceeds
    ``target_delta``.

    Raises
    ------
    ConfigError
        See :func:`mixture_delta`; also if ``target_delta`` is not in (0, 1).

    References
    ----------
    van Dijk et al., arXiv:2212.05796, Lemma B.1 / eq. (6), inverted (the root is moved up
    until the profile meets ``target_delta``). Hypotheses: those of :func:`mixture_delta`
    (one neighbouring relation, a component law that does not depend on the data).
    """
    target_delta = _check_delta(target_delta)
    mu_arr, w_arr = _mixture_arrays(mus, weights)
    inf_mass = float(w_arr[np.isinf(mu_arr)].sum())
    if inf_mass > target_delta:
        return math.inf
    log_w = np.log(w_arr)
    finite = np.isfinite(mu_arr)
    mu_max = float(mu_arr[finite].max()) if np.any(finite) else 0.0
    if mu_max == 0.0:
        return 0.0
    return _solve_decreasing(
        lambda e: _mixture_log_delta(e, mu_arr, log_w),
        math.log(target_delta),
        hi_start=max(1.0, mu_max),
    )


# --------------------------------------------------------------------------- calibration
def analytic_gaussian_sigma(
    local_epsilon: float, local_delta: float, sensitivity: float = 1.0
) -> float:
    """Smallest Gaussian noise std that makes an l2-sensitivity-``Delta`` query (eps0, delta0)-DP.

    Parameters
    ----------
    local_epsilon : float
        epsilon_0 >= 0.
    local_delta : float
        delta_0 in (0, 1).
    sensitivity : float
        l2 sensitivity Delta > 0 (e.g. ``2 * clipping_norm`` for replace-one).

    Returns
    -------
    float
        sigma = Delta / mu* where mu* is the largest mu with ``delta_{G_mu}(eps0) <= delta0``.

    Raises
    ------
    ConfigError
        On out-of-range arguments.

    References
    ----------
    Balle, Wang (2018), arXiv:1805.06530, Theorem 8 (the exact condition, here solved
    through G_mu). Hypotheses: ``sensitivity`` bounds the l2 distance of the query on any
    two neighbours of the caller's relation (``2 C`` under replace-one for a clip ``C``,
    ``C`` under add/remove).
    """
    eps = _check_epsilon(local_epsilon, "local_epsilon")
    delta = _check_delta(local_delta, "local_delta")
    sens = float(sensitivity)
    check(sens > 0 and math.isfinite(sens), "sensitivity", sensitivity, "must be > 0")
    mu = gdp_mu(eps, delta)
    return noise_for_mu(mu, sens, eps, delta)


def noise_for_mu(mu: float, scale: float, epsilon: float, delta: float) -> float:
    """``scale / mu``, nudged up until ``delta_{G_{scale/sigma}}(epsilon) <= delta`` holds.

    Guards the division against rounding so that a calibrated noise never falls short.
    The check is the profile of Dong, Roth, Su (arXiv:1905.02383, Corollary 2.13); hypotheses:
    ``scale`` is the l2 sensitivity under the caller's neighbouring relation.
    """
    if mu == 0.0:
        return math.inf
    sigma = scale / mu
    log_t = math.log(delta) - _MARGIN
    while float(gdp_log_delta(epsilon, scale / sigma)) > log_t:
        sigma *= 1.0 + 1e-12
    return sigma


# --------------------------------------------------------------------------- accountant
def gaussian_noise_multiplier(event: Any) -> float | None:
    """The noise multiplier of a dp-accounting event that is a Gaussian mechanism WITHOUT
    sampling (``GaussianDpEvent``; Poisson sampling at rate 1; sampling all N of N without
    replacement), per unit of the sensitivity under the ledger's relation; ``None`` for any
    other event. Such a release is exactly ``G_{1/σ}`` (Dong, Roth, Su, arXiv:1905.02383,
    Thm. 2.7): sampling at rate 1, or all N of N, leaves the Gaussian mechanism unchanged."""
    if isinstance(event, dp_event.GaussianDpEvent):
        return float(event.noise_multiplier)
    if isinstance(event, dp_event.PoissonSampledDpEvent) and event.sampling_probability == 1:
        return gaussian_noise_multiplier(event.event)
    if isinstance(event, dp_event.SampledWithoutReplacementDpEvent) and (
        event.sample_size == event.source_dataset_size
    ):
        return gaussian_noise_multiplier(event.event)
    return None


def gaussian_mu(runs: Runs) -> float | None:
    """μ of ``runs`` (``[(event, count), ...]``) when every event is a Gaussian without
    sampling with σ > 0: ``count`` releases at σ are √count/σ-GDP and μ² adds up (Dong, Roth,
    Su, arXiv:1905.02383, Cor. 3.3); ``None`` for any other event or no runs. Hypothesis:
    each σ is per unit of the sensitivity under the ledger's neighbouring relation
    (:func:`gaussian_noise_multiplier`)."""
    mu2 = 0.0
    for event, count in runs:
        sigma = gaussian_noise_multiplier(event)
        if sigma is None or sigma <= 0:
            return None
        mu2 += count / sigma**2
    return math.sqrt(mu2) if runs else None


class ExactGaussianAccountant:
    """Gaussian releases without sampling, exactly: the ledger's answer under
    ``accountant="pld"`` when every run is one (:func:`gaussian_noise_multiplier`).

    A release at noise multiplier σ (sensitivity 1) is exactly ``G_{1/σ}`` (Dong, Roth, Su,
    arXiv:1905.02383, Thm. 2.7); ``count`` of them compose to ``G_μ`` with μ² = Σ count/σ²
    (Cor. 3.3: composition of Gaussian trade-offs is Gaussian, adaptively), and the privacy
    profile of ``G_μ`` is the closed form of Cor. 2.13, inverted with a check on the returned
    value (:func:`gdp_epsilon`), so ε is the exact one, never below it.

    Parameters
    ----------
    settings : AccountingSettings, optional
        Unused (the relation is already in σ's sensitivity unit).
    """

    upper_bound: ClassVar[bool] = True

    def __init__(self, settings: AccountingSettings | None = None) -> None:
        self.settings = settings or AccountingSettings()

    def refusal(self, runs: Runs) -> str | None:
        """``None`` when every run is a Gaussian mechanism without sampling, σ > 0."""
        if gaussian_mu(runs) is None:
            return "not every run is a Gaussian mechanism without sampling with noise > 0"
        return None

    def epsilon(self, runs: Runs, target_delta: float) -> float:
        """The exact ε of ``G_μ`` at ``target_delta``."""
        return gdp_epsilon(target_delta, _runs_mu(runs))

    def delta(self, runs: Runs, target_epsilon: float) -> float:
        """The exact δ of ``G_μ`` at ``target_epsilon``."""
        return float(gdp_delta(target_epsilon, _runs_mu(runs)))

    def analysis(self, runs: Runs) -> str:
        """``"gaussian (exact)"``."""
        return "gaussian (exact)"


def _runs_mu(runs: Runs) -> float:
    mu = gaussian_mu(runs)
    if mu is None:
        raise ConfigError("runs", runs, "must all be Gaussian mechanisms without sampling")
    return mu
