"""Monte Carlo estimate of ε for random allocation (k of t rounds), with confidence bounds.

For ``k > 1`` the budget is pld-accounting's decomposition bound (valid, not tight:
:mod:`fedpriv.accounting.samplers.random_allocation`); this module ESTIMATES the ε of the scheme
itself, to
print beside it. It is never used for the budget or for calibration.

The pair (add/remove, one epoch, sensitivity 1 in units of the clip, noise multiplier z): P,
the client present in ``k`` uniformly chosen of the ``t`` rounds, ``y ~ N(1_S / z, I)``;
Q, absent, ``y ~ N(0, I)``. The privacy loss is

    L(y) = log( C(t, k)⁻¹ Σ_{|S| = k} exp(Σ_{i ∈ S} (y_i / z − 1 / (2 z²))) ),

an elementary symmetric polynomial of ``exp(y_i / z − 1 / (2 z²))``, computed exactly per
sample by the O(t k) recursion ``e_j ← e_j + x_i e_(j−1)`` in log space. L is symmetric in the
rounds, so under P the set S can be the first ``k`` rounds. Epochs compose by adding
independent per-epoch losses. The hockey-stick divergence is an expectation over the pair's
first distribution (Wang et al. 2023):

    δ_remove(ε) = E_P[(1 − e^(ε − L))₊],   δ_add(ε) = E_Q[(1 − e^(ε + L))₊],

and δ(ε) = max of the two directions. Each is the mean of a variable in [0, 1], so the
empirical Bernstein inequality (Maurer, Pontil 2009, Thm. 4: with probability 1 − a,
``|E X − X̄| <= sqrt(2 V ln(2/a) / n) + 7 ln(2/a) / (3 (n − 1))`` one-sided, V the sample
variance) bounds it from both sides. The bounds are checked on a grid of candidate ε that an
independent pilot sample fixes, with a union bound over every (candidate, direction, side),
so the interval ``[lower, upper]`` holds with probability at least ``confidence`` jointly:
``lower`` is the largest candidate where some direction's lower bound on δ exceeds the target
(so the true ε is above it), ``upper`` the smallest where both upper bounds are below it.

Plain sampling (no importance sampling): the variable is non-zero with probability about δ,
so at δ = 1e-3 and 10⁶ samples the interval is ±1 %; at δ = 1e-5 it is several times wider.
Seeded (``seed``), so every call with the same arguments answers the same numbers.

References
----------
Wang, Mahloujifar, Wu, Jia, Mittal, "A Randomized Approach to Tight Privacy Accounting"
(arXiv:2304.07927), Monte Carlo accounting; Maurer, Pontil, "Empirical Bernstein Bounds and
Sample Variance Penalization" (arXiv:0907.3740), Thm. 4; Feldman, Shenfeld
(arXiv:2602.17284), the random-allocation scheme.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar

import numpy as np
from scipy import optimize

from fedpriv.accounting.core.accountant import AccountingSettings, Runs
from fedpriv.accounting.samplers.random_allocation import RandomAllocationEvent
from fedpriv.common.errors import ConfigError, check

#: Samples of the composed loss per direction (fewer when epochs × t × k is large)...
MC_SAMPLES = 1_000_000
#: ...at most this many steps of the recursion per direction (samples × epochs × t × k:
#: 2 of 4 rounds, one epoch, 10⁶ samples: ~2 s for both directions and the pilot)...
MC_MAX_WORK = 10_000_000
#: ...and never fewer samples than this.
MC_MIN_SAMPLES = 10_000
#: Joint confidence of the interval.
MC_CONFIDENCE = 0.99
#: Candidate ε for the bounds: the pilot's estimate times these factors.
CANDIDATE_FACTORS = np.linspace(0.7, 1.3, 121)
#: The pilot sample's size, as a fraction of the main one.
PILOT_FRACTION = 0.25
#: Samples drawn at once (memory: CHUNK × t doubles).
CHUNK = 1 << 16


@dataclass(frozen=True)
class EpsilonEstimate:
    """A Monte Carlo estimate of ε and a confidence interval around it.

    Attributes
    ----------
    epsilon : float
        The estimate (not a bound).
    lower, upper : float
        ``lower <= ε <= upper`` with probability at least ``confidence`` (0 and ``inf`` where
        no candidate was decided).
    confidence : float
        The joint confidence of the interval.
    samples : int
        Samples per direction.
    """

    epsilon: float
    lower: float
    upper: float
    confidence: float
    samples: int


def log_elementary_symmetric(a: np.ndarray, k: int) -> np.ndarray:
    """``log e_k(exp(a_1), ..., exp(a_t))`` of each row of ``a``: the recursion
    ``e_j ← e_j + x_i e_(j−1)`` over the t columns, in log space (exact, O(t k)).

    Parameters
    ----------
    a : numpy.ndarray
        Shape (n, t), the logs of the polynomial's variables.
    k : int
        Degree, ``0 <= k <= t`` (``e_0 = 1``).

    Returns
    -------
    numpy.ndarray
        Shape (n,): ``log e_k`` per row (``-inf`` for k > t).
    """
    n, t = a.shape
    log_e = np.full((k + 1, n), -np.inf)
    log_e[0] = 0.0
    for i in range(t):
        for j in range(min(i + 1, k), 0, -1):
            log_e[j] = np.logaddexp(log_e[j], log_e[j - 1] + a[:, i])
    top: np.ndarray = log_e[k]
    return top


def allocation_loss(y: np.ndarray, noise_multiplier: float, k: int) -> np.ndarray:
    """The privacy loss ``log p/q`` of the k-of-t allocation pair (module docstring).

    The pair of random allocation (Feldman, Shenfeld, arXiv:2602.17284) for one client at
    sensitivity 1. Hypotheses: the add/remove relation (the client present or absent); its
    ``k`` rounds uniform among ``t``; a Gaussian of std ``z`` per round; the other clients'
    contributions fixed (they cancel in the ratio).

    Parameters
    ----------
    y : numpy.ndarray
        Shape (n, t): outputs in units of the noise std (one row per epoch drawn).
    noise_multiplier : float
        z > 0.
    k : int
        Rounds per client, ``1 <= k <= t``.

    Returns
    -------
    numpy.ndarray
        Shape (n,): ``L(y)`` per row.
    """
    z, t = noise_multiplier, y.shape[1]
    log_count = math.lgamma(t + 1) - math.lgamma(k + 1) - math.lgamma(t - k + 1)
    return log_elementary_symmetric(y / z - 1 / (2 * z * z), k) - log_count


def _epoch_losses(
    rng: np.random.Generator, n: int, event: RandomAllocationEvent, present: bool
) -> np.ndarray:
    """The loss of ``n`` epochs drawn from P (``present``) or Q."""
    z, t, k = float(event.noise_multiplier), event.num_steps, event.num_selected
    losses = np.empty(n)
    for start in range(0, n, CHUNK):
        y = rng.standard_normal((min(CHUNK, n - start), t))
        if present:
            y[:, :k] += 1 / z
        losses[start : start + len(y)] = allocation_loss(y, z, k)
    return losses


def composed_losses(
    events: list[tuple[RandomAllocationEvent, int]], n: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` samples of the composed privacy loss, remove (``L`` under P) and add (``−L``
    under Q): the sum of independent epochs' losses, ``count`` epochs of each event."""
    remove, add = np.zeros(n), np.zeros(n)
    for event, count in events:
        for _ in range(count):
            remove += _epoch_losses(rng, n, event, present=True)
            add -= _epoch_losses(rng, n, event, present=False)
    return remove, add


class _HockeyStick:
    """The samples' mean and variance of ``(1 − e^(ε − L))₊`` at any ε >= 0, from the sorted
    losses and suffix sums of ``e^(−L)`` and ``e^(−2L)`` over ``L > 0``."""

    def __init__(self, losses: np.ndarray) -> None:
        self.losses = np.sort(losses)
        positive = np.where(self.losses > 0, np.exp(-np.maximum(self.losses, 0.0)), 0.0)
        self.s1 = np.append(np.cumsum(positive[::-1])[::-1], 0.0)
        self.s2 = np.append(np.cumsum((positive**2)[::-1])[::-1], 0.0)
        self.n = len(losses)

    def moments(self, eps: float) -> tuple[float, float]:
        """(mean, unbiased variance) of the variable at ``eps`` >= 0."""
        i = int(np.searchsorted(self.losses, eps, side="right"))
        count, e = self.n - i, math.exp(eps)
        mean = max(0.0, (count - e * self.s1[i]) / self.n)
        second = max(0.0, (count - 2 * e * self.s1[i] + e * e * self.s2[i]) / self.n)
        return mean, max(0.0, second - mean * mean) * self.n / (self.n - 1)

    def width(self, eps: float, a: float) -> float:
        """Maurer–Pontil's one-sided deviation at ``eps``, probability ``a`` (Thm. 4)."""
        _, var = self.moments(eps)
        log_term = math.log(2 / a)
        return math.sqrt(2 * var * log_term / self.n) + 7 * log_term / (3 * (self.n - 1))


def _point_estimate(sides: list[_HockeyStick], delta: float) -> float:
    """The ε where the samples' δ(ε) (the larger direction) equals ``delta`` (0 below)."""

    def excess(eps: float) -> float:
        return max(side.moments(eps)[0] for side in sides) - delta

    if excess(0.0) <= 0:
        return 0.0
    top = max(float(side.losses[-1]) for side in sides) + 1.0
    return float(optimize.brentq(excess, 0.0, top, xtol=1e-6, rtol=1e-9))


def _interval(
    sides: list[_HockeyStick], delta: float, pilot: float, confidence: float
) -> tuple[float, float]:
    """The candidates' decided interval (module docstring): union bound over all of them."""
    candidates = pilot * CANDIDATE_FACTORS
    a = (1 - confidence) / (2 * len(sides) * len(candidates))
    lower, upper = 0.0, math.inf
    for eps in candidates:
        bounds = [(s.moments(eps)[0], s.width(eps, a)) for s in sides]
        if max(m - w for m, w in bounds) > delta:
            lower = max(lower, float(eps))
        if max(m + w for m, w in bounds) <= delta:
            upper = min(upper, float(eps))
    return lower, upper


def sample_count(events: list[tuple[RandomAllocationEvent, int]]) -> int:
    """Samples per direction: :data:`MC_SAMPLES`, fewer when the epochs' recursion steps
    exceed :data:`MC_MAX_WORK`, at least :data:`MC_MIN_SAMPLES`."""
    work = sum(count * event.num_steps * event.num_selected for event, count in events)
    return max(MC_MIN_SAMPLES, min(MC_SAMPLES, MC_MAX_WORK // max(1, work)))


def allocation_epsilon_estimate(
    events: list[tuple[Any, int]],
    target_delta: float,
    *,
    confidence: float = MC_CONFIDENCE,
    seed: int = 0,
) -> EpsilonEstimate | None:
    """The Monte Carlo estimate of the ε at ``target_delta`` of whole random-allocation epochs,
    with its ``confidence`` interval (module docstring). Cached per arguments (the command
    line asks for the estimate and the lower bound).

    Parameters
    ----------
    events : list of (RandomAllocationEvent, int)
        Whole epochs and how many of each (their losses add up).
    target_delta : float
        δ in (0, 1).
    confidence : float
        Joint confidence of the interval, in (0, 1).
    seed : int
        Seed of the pilot and main samples (same seed, same answer).

    Returns
    -------
    EpsilonEstimate or None
        ``None`` when an event is not a whole epoch of random allocation.

    Raises
    ------
    ConfigError
        For ``target_delta`` or ``confidence`` outside (0, 1).

    References
    ----------
    Wang, Mahloujifar, Wu, Jia, Mittal (arXiv:2304.07927), Monte Carlo accounting; Maurer,
    Pontil (arXiv:0907.3740), Thm. 4 (the interval). Hypotheses: the add/remove relation and
    the pair of :func:`allocation_loss`; whole epochs with independent allocations; the
    interval holds with probability ``confidence`` over the seeded samples, so it is a
    statistical bound, never a budget.
    """
    check(0 < target_delta < 1, "target_delta", target_delta, "must be in (0, 1)")
    check(0 < confidence < 1, "confidence", confidence, "must be in (0, 1)")
    if not events or not all(_whole_epoch(event) for event, _ in events):
        return None
    return _estimate(tuple(events), target_delta, confidence, seed)


@lru_cache(maxsize=16)
def _estimate(
    events: tuple[tuple[RandomAllocationEvent, int], ...],
    delta: float,
    confidence: float,
    seed: int,
) -> EpsilonEstimate:
    runs = list(events)
    n = sample_count(runs)
    pilot = _sides(runs, int(n * PILOT_FRACTION), seed, stream=0)
    sides = _sides(runs, n, seed, stream=1)
    lower, upper = _interval(sides, delta, _point_estimate(pilot, delta), confidence)
    return EpsilonEstimate(_point_estimate(sides, delta), lower, upper, confidence, n)


def _sides(
    runs: list[tuple[RandomAllocationEvent, int]], n: int, seed: int, stream: int
) -> list[_HockeyStick]:
    """Both directions' hockey sticks from ``n`` samples of stream ``stream`` of ``seed``
    (0: the pilot, 1: the main sample)."""
    rng = np.random.default_rng([seed, stream])
    return [_HockeyStick(x) for x in composed_losses(runs, n, rng)]


def _whole_epoch(event: Any) -> bool:
    return isinstance(event, RandomAllocationEvent) and not event.truncated


class MonteCarloEstimate:
    """The Monte Carlo ESTIMATE of whole random-allocation epochs behind the accountant
    protocol (module docstring: Wang et al. arXiv:2304.07927; Maurer, Pontil Thm. 4 for its
    interval). ``upper_bound = False``: it can fall below the true ε, so no ledger, budget or
    calibration uses it (:mod:`fedpriv.accounting.accountants.registry`); it is printed beside
    the budget.

    Parameters
    ----------
    settings : AccountingSettings, optional
        Only the neighbouring relation is read (the pair above is add/remove).
    confidence, seed : float, int
        As :func:`allocation_epsilon_estimate`.
    """

    upper_bound: ClassVar[bool] = False

    def __init__(
        self,
        settings: AccountingSettings | None = None,
        *,
        confidence: float = MC_CONFIDENCE,
        seed: int = 0,
    ) -> None:
        self.settings = settings or AccountingSettings()
        self.confidence = confidence
        self.seed = seed

    def refusal(self, runs: Runs) -> str | None:
        """``None`` for whole epochs of random allocation under add/remove."""
        if self.settings.neighboring_relation != "add_remove":
            return "the Monte Carlo pair is add/remove only"
        if not runs or not all(_whole_epoch(event) for event, _ in runs):
            return "the Monte Carlo estimate covers whole random-allocation epochs only"
        return None

    def epsilon(self, runs: Runs, target_delta: float) -> float:
        """The estimate of ε at ``target_delta`` (not a bound)."""
        est = allocation_epsilon_estimate(
            list(runs), target_delta, confidence=self.confidence, seed=self.seed
        )
        if est is None:
            raise ConfigError("runs", runs, "must be whole random-allocation epochs")
        return est.epsilon

    def delta(self, runs: Runs, target_epsilon: float) -> float:
        """The estimate of δ at ``target_epsilon`` (the larger direction's sample mean of
        ``(1 − e^(ε − L))₊`` on the main sample; not a bound)."""
        events = list(runs)
        sides = _sides(events, sample_count(events), self.seed, stream=1)
        return max(side.moments(target_epsilon)[0] for side in sides)

    def analysis(self, runs: Runs) -> str:
        """``"monte carlo (estimate)"``."""
        return "monte carlo (estimate)"
