"""A lower bound on the ε of generalized DP-SGD with shuffling or subsampling (one record).

Realised pairs (linear losses: every other record's gradient is 0, so a group holding the
differing record sends exactly that record's clipped update; noise N(0, (2Cσ)² I) per round):

* subsampling: each round draws its m·s records of N without replacement, independently; the
  differing record (update +C v, replaced by one with −C v) is in the round's batch with
  probability m·s/N: the replace-one pairs of a fixed-size sampled Gaussian with multiplier
  2σ per unit C (:class:`~fedpriv.accounting.without_replacement.WithoutReplacementGaussianEvent`),
  one per round.
* shuffling: the larger of two post-processings of each epoch's R rounds: the epoch's first
  round alone (its batch is a uniform m·s-subset of N: the pair above) and the record
  (update +C v, replaced by one with update 0) in one uniformly random round of the R: random
  allocation of 1 of R rounds with multiplier 2σ (pld-accounting's lower PLD); epochs use
  independent permutations and compose; a partial last epoch adds its first round.

Each is composed with optimistic PLDs (:mod:`fedpriv.accounting.lower_bound`). The bound is for
ONE differing record: a valid lower bound for any ``group_privacy`` g, loose for g > 1. The
analysis it is compared with reveals to the adversary the rounds the record fell in (the
mixture over c of the first paper), so with many rounds per epoch it gives up the shuffle's
amplification that this bound keeps.

References
----------
van Dijk, Nguyen, Nguyen, Phan, arXiv:2212.05796, Algorithm 1 (the mechanism); Lebeda,
Regehr, Kamath, Steinke, arXiv:2405.20769 (fixed-size pairs); Feldman, Shenfeld,
arXiv:2602.17284 (random allocation's lower bound).
"""

from __future__ import annotations

import math
from typing import Any

from fedpriv.accounting.allocation import RandomAllocationEvent
from fedpriv.accounting.lower_bound import epsilon_lower_bound
from fedpriv.accounting.without_replacement import WithoutReplacementGaussianEvent
from fedpriv.mechanisms.samplers import SamplerKind


def batch_clipping_lower_bound(
    sampler: SamplerKind,
    num_samples: int,
    batch_size: int,
    rounds: int,
    noise_multiplier: float,
    target_delta: float,
) -> float | None:
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
        return math.inf
    z = 2.0 * noise_multiplier  # noise std per unit C
    first_round = WithoutReplacementGaussianEvent(z, batch_size, num_samples)
    if sampler is SamplerKind.SUBSAMPLE:
        return _epsilon([(first_round, rounds)], target_delta)
    per_epoch = num_samples // batch_size
    epochs, rest = divmod(rounds, per_epoch)
    started = epochs + (1 if rest else 0)
    bounds = [_epsilon([(first_round, started)], target_delta)]
    if epochs:
        allocation = RandomAllocationEvent(z, per_epoch) if per_epoch > 1 else first_round
        bounds.append(_epsilon([(allocation, epochs)], target_delta))
    return max(bounds)


def _epsilon(events: list[tuple[Any, int]], target_delta: float) -> float:
    bound = epsilon_lower_bound(events, target_delta)
    assert bound is not None  # both events have a lower PLD
    return bound
