"""A lower bound on the ε of generalized DP-SGD with shuffling or subsampling (one record).

Realised pairs (linear losses: every other record's gradient is 0, so a group holding the
differing record sends exactly that record's clipped update; noise N(0, (2Cσ)² I) per round):

* subsampling: each round draws its m·s records of N without replacement, independently; the
  differing record (update +C v, replaced by one with −C v) is in the round's batch with
  probability m·s/N: the replace-one pairs of a fixed-size sampled Gaussian with multiplier
  2σ per unit C (:class:`~fedpriv.accounting.samplers.fixed_size.WithoutReplacementGaussianEvent`),
  one per round.
* shuffling, the largest of three:

  - the epoch's first round alone (its batch is a uniform m·s-subset of N: the pair above);
  - the record (update +C v, replaced by one with update 0) in one uniformly random round of
    the R: random allocation of 1 of R rounds with multiplier 2σ (pld-accounting's lower PLD);
  - the FULL-SHIFT pair (:func:`full_shift_lower_bound`): update +C v replaced by −C v. The
    record lands in round i with probability m·s/N each, or in the N − R·m·s records the
    epoch leaves out; along v the epoch's R releases are, in units of C,
    P = p₀ N(0, z² I) + p Σ_i N(+e_i, z² I) and Q the same with −e_i (z = 2σ, p = m·s/N,
    p₀ = 1 − R p); epochs use independent permutations, so their privacy losses add. Its
    δ(ε) = E_P[(1 − e^{ε − L})₊] (L the pair's log-likelihood ratio, exact in closed form per
    sample) is bounded from below with confidence 1 − α by Hoeffding's relative-entropy
    (Chernoff) bound for means of independent [0, 1] variables; the largest ε whose lower
    confidence bound on δ(ε) exceeds the target is a lower bound on ε with confidence 1 − α
    (δ(ε) and its bound both fall with ε, so the one fixed point ε* of the true profile
    carries the only failure event: no correction for the search over ε is needed). The
    draws are seeded (deterministic) and capped (:data:`MAX_DRAWS`), so it costs seconds;
    with few draws the bound is only weaker.

Each PLD bound is composed with optimistic PLDs (:mod:`fedpriv.accounting.core.lower_bound`). The
bound is for ONE differing record: a valid lower bound for any ``group_privacy`` g, loose for
g > 1.

References
----------
van Dijk, Nguyen, Nguyen, Phan, arXiv:2212.05796, Algorithm 1 (the mechanism); Lebeda,
Regehr, Kamath, Steinke, arXiv:2405.20769 (fixed-size pairs); Feldman, Shenfeld,
arXiv:2602.17284 (random allocation's lower bound); Hoeffding, "Probability inequalities for
sums of bounded random variables" (JASA 1963), Theorem 1 (the relative-entropy bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import logsumexp

from fedpriv.accounting.core.lower_bound import epsilon_lower_bound
from fedpriv.accounting.samplers.fixed_size import WithoutReplacementGaussianEvent
from fedpriv.accounting.samplers.random_allocation import RandomAllocationEvent
from fedpriv.common.errors import check
from fedpriv.mechanisms.samplers import SamplerKind

#: Gaussian draws spent by the full-shift Monte Carlo (samples x rounds): about 1 s here.
MAX_DRAWS = 10_000_000
#: Samples of the full-shift Monte Carlo at most (fewer when rounds are many).
MAX_SAMPLES = 1_000_000
#: 1 − confidence of the full-shift Monte Carlo bound.
ALPHA = 1e-3
#: Seed of the full-shift Monte Carlo (deterministic output).
SEED = 20212


@dataclass(frozen=True)
class LowerBound:
    """A lower bound on ε and how it was obtained.

    Attributes
    ----------
    epsilon : float
        The bound (the largest of the parts).
    confidence : float
        1 when every part is exact; 1 − α when the Monte Carlo part is the largest.
    detail : dict
        Each part's value (and the Monte Carlo's samples, seed and confidence).
    """

    epsilon: float
    confidence: float = 1.0
    detail: dict[str, Any] = field(default_factory=dict)


def batch_clipping_lower_bound(
    sampler: SamplerKind,
    num_samples: int,
    batch_size: int,
    rounds: int,
    noise_multiplier: float,
    target_delta: float,
) -> LowerBound | None:
    """A lower bound on ε at ``target_delta`` after ``rounds`` local rounds (one record);
    ``None`` for a sampler other than shuffle and subsample.

    Parameters
    ----------
    sampler : SamplerKind
        ``shuffle`` or ``subsample`` (others: ``None``).
    num_samples : int
        N, the client's records.
    batch_size : int
        m·s records per round (``<= N``).
    rounds : int
        Local rounds released.
    noise_multiplier : float
        σ of the first paper: noise std 2Cσ (0: ``inf``).
    target_delta : float
        δ in (0, 1).
    """
    if sampler not in (SamplerKind.SHUFFLE, SamplerKind.SUBSAMPLE):
        return None
    if noise_multiplier <= 0:
        return LowerBound(math.inf)
    z = 2.0 * noise_multiplier  # noise std per unit C
    first_round = WithoutReplacementGaussianEvent(z, batch_size, num_samples)
    if sampler is SamplerKind.SUBSAMPLE:
        bound = _epsilon([(first_round, rounds)], target_delta)
        return LowerBound(bound, 1.0, {"fixed_size_pair": bound})
    per_epoch = num_samples // batch_size
    epochs, rest = divmod(rounds, per_epoch)
    parts = {"first_round": _epsilon([(first_round, epochs + (1 if rest else 0))], target_delta)}
    if epochs:
        allocation = RandomAllocationEvent(z, per_epoch) if per_epoch > 1 else first_round
        parts["allocation_shift_c"] = _epsilon([(allocation, epochs)], target_delta)
    exact = max(parts.values())
    mc = full_shift_lower_bound(z, batch_size / num_samples, per_epoch, epochs, rest, target_delta)
    detail: dict[str, Any] = {**parts, "full_shift_monte_carlo": mc}
    if mc["epsilon"] > exact:
        return LowerBound(mc["epsilon"], 1.0 - ALPHA, detail)
    return LowerBound(exact, 1.0, detail)


def _epsilon(events: list[tuple[Any, int]], target_delta: float) -> float:
    bound = epsilon_lower_bound(events, target_delta)
    assert bound is not None  # both events have a lower PLD
    return bound


def full_shift_lower_bound(
    noise_multiplier: float,
    rate: float,
    rounds_per_epoch: int,
    epochs: int,
    rest: int,
    target_delta: float,
    seed: int = SEED,
) -> dict[str, Any]:
    """ε lower bound, with confidence ``1 − ALPHA``, of the full-shift shuffling pair.

    Parameters
    ----------
    noise_multiplier : float
        z > 0, noise std per unit C (2σ in the paper's σ).
    rate : float
        p = m·s/N, the probability that the record is in a given round of an epoch.
    rounds_per_epoch : int
        R, rounds of a whole epoch.
    epochs, rest : int
        Whole epochs released, and the rounds released of one more (0 <= rest < R).
    target_delta : float
        δ in (0, 1).
    seed : int
        Seed of the draws.

    Returns
    -------
    dict
        ``epsilon`` (0 when no ε > 0 is certified), ``confidence``, ``samples``, ``seed``.

    References
    ----------
    Hoeffding 1963, Theorem 1; the pair: module docstring.
    """
    check(0 < target_delta < 1, "target_delta", target_delta, "must be in (0, 1)")
    blocks = [rounds_per_epoch] * epochs + ([rest] if rest else [])
    total_rounds = max(1, sum(blocks))
    n = int(min(MAX_SAMPLES, MAX_DRAWS // total_rounds))
    out = {"epsilon": 0.0, "confidence": 1.0 - ALPHA, "samples": n, "seed": seed}
    if n < 100 or not blocks:
        return out
    rng = np.random.default_rng(seed)
    loss = np.zeros(n)
    for block in blocks:
        loss += _epoch_losses(rng, noise_multiplier, rate, block, n)
    out["epsilon"] = _certified_epsilon(np.sort(loss)[::-1], target_delta, math.log(1 / ALPHA))
    return out


def _epoch_losses(
    rng: np.random.Generator, z: float, rate: float, rounds: int, n: int
) -> np.ndarray:
    """``n`` draws under P of one epoch's privacy loss ln P(y)/Q(y) (``rounds`` released)."""
    log_p0 = math.log1p(-rate * rounds) if rate * rounds < 1 else -math.inf
    out = np.empty(n)
    chunk = max(1, 2_000_000 // rounds)
    for start in range(0, n, chunk):
        k = min(chunk, n - start)
        y = z * rng.standard_normal((k, rounds))
        where = rng.random(k) * (1.0 / rate)  # in round floor(where) when < rounds
        hit = where < rounds
        y[np.flatnonzero(hit), where[hit].astype(int)] += 1.0
        y /= z**2  # ln N(y; ±e_i, z²)/N(y; 0, z²) = ±y_i/z² − 1/(2z²)
        shift = math.log(rate) - 0.5 / z**2
        up, down = logsumexp(y, axis=1) + shift, logsumexp(-y, axis=1) + shift
        out[start : start + k] = np.logaddexp(log_p0, up) - np.logaddexp(log_p0, down)
    return out


def _certified_epsilon(desc_loss: np.ndarray, target_delta: float, log_inv_alpha: float) -> float:
    """The largest ε (to 1e-4) whose lower confidence bound on δ(ε) exceeds the target, from
    privacy losses sorted in decreasing order; 0 when even ε = 0 is not certified."""

    def certified(eps: float) -> bool:
        return _delta_lcb(desc_loss, eps, log_inv_alpha) > target_delta

    if not certified(0.0):
        return 0.0
    lo, hi = 0.0, max(1.0, float(desc_loss[0]))
    while hi - lo > 1e-4:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if certified(mid) else (lo, mid)
    return lo


def _delta_lcb(desc_loss: np.ndarray, eps: float, log_inv_alpha: float) -> float:
    """Lower confidence bound (level 1 − α) on E[(1 − e^{ε − L})₊] from the samples: the
    smallest μ <= the mean with n kl(mean, μ) <= ln(1/α) (Hoeffding 1963, Thm 1)."""
    n = desc_loss.size
    top = desc_loss[: int(np.searchsorted(-desc_loss, -eps, side="left"))]
    mean = float(np.sum(-np.expm1(eps - top))) / n
    if mean <= 0.0:
        return 0.0

    def feasible(mu: float) -> bool:  # kl(mean || mu) falls as mu rises to the mean
        return n * _kl(mean, mu) <= log_inv_alpha

    lo, hi = math.log(1e-300), math.log(mean)  # bisect in log mu: infeasible lo, feasible hi
    if feasible(math.exp(lo)):
        return 0.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if feasible(math.exp(mid)) else (mid, hi)
    return math.exp(lo)


def _kl(a: float, b: float) -> float:
    """Bernoulli relative entropy kl(a || b)."""
    out = a * math.log(a / b) if a > 0 else 0.0
    return out + ((1 - a) * math.log((1 - a) / (1 - b)) if a < 1 else 0.0)
