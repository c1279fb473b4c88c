"""A realised pair for random check-ins with local randomizers (a lower bound on ε).

The check-in theorems (Balle, Bell, Gascon, Kairouz, Thakurta arXiv:2007.06605) and the shuffle
analysis (Feldman, McMillan, Talwar arXiv:2012.12803) bound ε from above for EVERY ε0-DP
randomizer; the local ε0 is no lower bound of the amplified ε. A lower bound needs a pair of
datasets and a statistic of the released updates whose two distributions are computed. Here,
for a pass of ``K`` released reports (``shuffle``: the ``n`` reports shuffled; ``fixed``,
Algorithm 1 with each slot's update released: the ``m`` slots):

* every record's loss is linear in the model, so each client's clipped update is a constant
  vector: every client's is 0, except the target's, 0 in ``D`` and ``Δ e_1`` in ``D'``
  (``fixed``: ``Δ = L``, so that a dummy, the randomizer on the zero vector, looks like any
  other report), or every client's is ``-L e_1`` and the target's ``±L e_1`` (``shuffle``:
  ``Δ = 2L``);
* the statistic is ``N``, the number of released reports whose first coordinate exceeds the
  common value by at least ``Δ``: a function of the released multiset.

Each report other than the target's exceeds with ``a0 = P(noise >= Δ)`` (Laplace:
``e^(-Δ/b)/2``; Gaussian: ``Φ̄(Δ/σ)``), the target's shifted report with ``1/2``. Under ``D``
``N ~ Bin(K, a0)``; under ``D'`` the target's report is released with probability ``π``
(``shuffle``: 1; ``fixed``: ``p0 E[1/(1 + C)] = (1 - (1 - r)^n)/(n r) p0`` with
``C ~ Bin(n - 1, r)``, ``r = p0/m``, the slot picking one of its check-ins uniformly), so
``N ~ (1 - π) Bin(K, a0) + π (Bin(K - 1, a0) + Bernoulli(1/2))``. Passes draw fresh check-ins:
the pair composes. Both directions' PLDs are discretized optimistically (Doroshenko, Ghazi,
Kamath, Kumar, Manurangsi arXiv:2207.04380) and the larger ε is a lower bound.
"""

from __future__ import annotations

import math

import numpy as np
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from scipy import stats

from fedpriv.accounting.accountants.pld_grid import LOWER_DISCRETIZATION
from fedpriv.mechanisms.checkin_draw import CheckinVariant
from fedpriv.mechanisms.randomizers import LocalRandomizer, RandomizerKind

__all__ = ["COVERED", "checkin_lower_bound"]

#: The variants with a realised pair here.
COVERED = (CheckinVariant.FIXED, CheckinVariant.SHUFFLE)


def checkin_lower_bound(
    variant: CheckinVariant,
    randomizer: LocalRandomizer,
    num_clients: int,
    num_slots: int,
    checkin_probability: float,
    passes: int,
    target_delta: float,
) -> float:
    """Lower bound on ε after ``passes`` passes at ``target_delta`` (module docstring).

    Raises
    ------
    ValueError
        For a variant outside :data:`COVERED`.
    """
    if variant not in COVERED:
        raise ValueError(f"no realised pair for variant {variant}")
    shuffle = variant is CheckinVariant.SHUFFLE
    shift = (2.0 if shuffle else 1.0) * randomizer.clipping_norm
    reports = num_clients if shuffle else num_slots
    released = 1.0 if shuffle else _released(num_clients, num_slots, checkin_probability)
    a0 = _tail(randomizer, shift)
    without, with_ = _count_pmfs(reports, a0, released)
    pairs = ((with_, without), (without, with_))
    return max(0.0, *(_epsilon(upper, lower, passes, target_delta) for upper, lower in pairs))


def _epsilon(upper: np.ndarray, lower: np.ndarray, passes: int, target_delta: float) -> float:
    """ε at ``target_delta`` of ``passes`` compositions of the pair ``(upper || lower)``,
    discretized optimistically."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # logsumexp's 0/0
        pld = pld_lib.from_two_probability_mass_functions(
            _logs(lower),
            _logs(upper),
            pessimistic_estimate=False,
            value_discretization_interval=LOWER_DISCRETIZATION,
        )
        pld = pld.self_compose(passes) if passes > 1 else pld
        return float(pld.get_epsilon_for_delta(target_delta))


def _released(num_clients: int, num_slots: int, p0: float) -> float:
    """``π = p0 E[1/(1 + C)]``, ``C ~ Bin(n - 1, r)``, ``r = p0/m``: the probability that the
    target checks in and its slot picks it."""
    r = p0 / num_slots
    if r >= 1.0:  # m = 1, p0 = 1: every client checks in, the slot picks one of n
        return 1.0 / num_clients
    return p0 * -math.expm1(num_clients * math.log1p(-r)) / (num_clients * r)


def _tail(randomizer: LocalRandomizer, shift: float) -> float:
    """``P(noise >= shift)`` of one coordinate of the randomizer's noise."""
    b = randomizer.noise_scale
    if randomizer.kind is RandomizerKind.LAPLACE:
        return 0.5 * math.exp(-shift / b)
    return float(stats.norm.sf(shift / b))


def _count_pmfs(reports: int, a0: float, released: float) -> tuple[np.ndarray, np.ndarray]:
    """The pmfs of ``N`` on ``0..K`` without and with the target (module docstring)."""
    ks = np.arange(reports + 1)
    without = stats.binom.pmf(ks, reports, a0)
    others = stats.binom.pmf(ks, reports - 1, a0)  # 0 at k = K
    shifted = 0.5 * others + 0.5 * np.concatenate([[0.0], others[:-1]])
    return without, (1 - released) * without + released * shifted


def _logs(pmf: np.ndarray) -> dict[int, float]:
    """``{k: log pmf[k]}`` over the positive masses."""
    return {int(k): float(math.log(p)) for k, p in enumerate(pmf) if p > 0}
