"""Random allocation ("balls in bins"): each client takes part in ``k`` of each ``t`` rounds.

Every client chooses, independently and uniformly, ``k`` of the ``t`` rounds of an epoch in
which its (clipped) contribution enters a Gaussian sum with noise multiplier ``σ``. The privacy
loss of one epoch is accounted with the tight PLD of Feldman and Shenfeld, computed by the
``pld-accounting`` package (``PLD_accounting``) as a dp-accounting
:class:`~dp_accounting.pld.privacy_loss_distribution.PrivacyLossDistribution`, dominating
(pessimistic) discretization, add/remove neighbours; epochs compose by PLD self-composition.

A run that releases only the first ``r < t`` rounds of an epoch (k = 1) is charged for them:
the client's one round falls among them with probability ``r/t``, and given that it is
uniform over them, so the released view is the ``r``-round allocation subsampled at rate
``r/t`` (remove: ``(r/t)·A_r(D ∪ x) + (1 − r/t)·M(D)`` against ``M(D)``, add the mirror), whose
PLD is pld-accounting's ``subsample_pld`` of the ``r``-round PLD. ``r`` is rounded up to
:func:`charged_rounds` (1, 2, 3, 4, 6, 8, 12, ...: releasing more rounds is never cheaper,
so this stays an upper bound and a run builds a handful of PLDs per epoch, not ``t``). For
``k > 1`` the rounds that fall among the first ``r`` are a hypergeometric mixture of
allocations that no analysis here covers, so the whole epoch is charged at its first round
(the released rounds are a post-processing of the epoch's).

References
----------
Feldman, Shenfeld, "Efficient Privacy Loss Accounting for Subsampling and Random Allocation"
(arXiv:2602.17284), the random-allocation PLD (their Sec. 4; package ``pld-accounting`` 2.0,
``gaussian_allocation_pld``) and PLD subsampling (their App. C, ``subsample_pld``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar

from fedpriv.accounting.accountants.pld_grid import (
    LOWER_DISCRETIZATION,
    optimistic_gaussian_pld,
    relative_interval,
    sampled_gaussian_loss_rms,
)
from fedpriv.accounting.core.event import PldEvent
from fedpriv.common.errors import check

#: The coarsest loss discretization of the allocation PLD (pld-accounting's
#: ``loss_discretization``). The PLD dominates the mechanism at any grid, so ε stays an upper
#: bound; at σ = 1, t = 50, 10 epochs, δ = 1e-5: 2.546 at 5e-3 against 2.564 at 1e-2, ~5 s per
#: distinct event (numba). Finer where an epoch's loss is small (:func:`allocation_interval`)...
ALLOCATION_DISCRETIZATION = 5e-3
#: ...but never finer than this: pld-accounting's time grows with the points of the grid (σ = 20,
#: t = 50, 10 epochs: 0.0878 at 5e-3 in 0.25 s, 0.0704 at 1e-3 in 2.7 s, 0.0692 at 7e-4 in
#: 10 s, 0.0671 at 2e-4 in 57 s), and calibration builds several PLDs.
ALLOCATION_FINEST = 1e-3


def allocation_interval(sigma: float, num_steps: int, num_selected: int) -> float:
    """The loss grid of the allocation PLD: a tenth of a scale of one epoch's privacy loss,
    the root mean square of ``t`` Poisson-sampled Gaussian rounds at rate k/t (√t times one
    round's, :func:`~fedpriv.accounting.accountants.pld_grid.sampled_gaussian_loss_rms`), within
    [:data:`ALLOCATION_FINEST`, :data:`ALLOCATION_DISCRETIZATION`]. A function of the event
    alone (the ledger and a resume see one PLD); the PLD dominates at any grid
    (pld-accounting's ``BoundType.DOMINATES``, Feldman and Shenfeld, arXiv:2602.17284), so the
    grid sets only how close. pld-accounting rounds each epoch's losses, so its error grows
    with the epochs composed (~0.35 grid per epoch measured at σ = 5 and 20), unlike the
    connect-the-dots grid of fixed-size cohorts."""
    scale = math.sqrt(num_steps) * sampled_gaussian_loss_rms(sigma, num_selected / num_steps)
    return max(ALLOCATION_FINEST, relative_interval(scale, ALLOCATION_DISCRETIZATION))


def charged_rounds(released: int, num_steps: int) -> int:
    """The rounds a partial epoch is charged for: ``released`` rounded up to 1, 2, 3, 4, 6, 8,
    12, 16, ... (powers of two and three times them), at most ``num_steps``.

    An upper bound by post-processing (Dwork, Roth 2014, Proposition 2.1): the first
    ``released`` rounds are a function of the first ``charged`` ones. Hypotheses: those of
    :class:`RandomAllocationEvent` for a partial epoch (k = 1, add/remove relation).
    """
    charged = 1
    while charged < released:
        power_of_two = charged & (charged - 1) == 0
        charged += max(1, charged // 2) if power_of_two else charged // 3
    return min(charged, num_steps)


@dataclass(frozen=True)
class RandomAllocationEvent(PldEvent):
    """One epoch of random allocation: each client in ``num_selected`` of ``num_steps`` rounds,
    of which the first ``released_rounds`` are released (``None``: all).

    Parameters
    ----------
    noise_multiplier : float
        σ > 0: noise std of each round's sum per unit of a client's L2 sensitivity.
    num_steps : int
        Rounds per epoch ``t`` >= 1.
    num_selected : int
        Rounds each client takes part in per epoch, ``1 <= k <= t``.
    released_rounds : int or None
        ``r`` in ``1..t``: the epoch's first ``r`` rounds are released (``r < t`` needs k = 1,
        see the module docstring); ``None`` or ``t``: the whole epoch.

    Raises
    ------
    ConfigError
        For σ <= 0 or non-finite, ``t`` < 1, ``k`` outside ``1..t``, ``r`` outside ``1..t``,
        or ``r < t`` with ``k > 1``.

    Notes
    -----
    Bound: the dominating PLD of random allocation (Feldman, Shenfeld, arXiv:2602.17284,
    Sec. 4; ``pld-accounting``'s ``gaussian_allocation_pld``, ``BoundType.DOMINATES``) and,
    for a partial epoch, its PLD subsampling (their App. C; :func:`subsampled_allocation_pld`).
    Hypotheses: the add/remove relation (the default ``supported_relations``); each client
    picks its ``k`` rounds uniformly, independently of the other clients and of the data;
    each round releases a Gaussian sum with std ``σ`` per unit of a client's L2 sensitivity;
    epochs use independent allocations (they compose by PLD self-composition).
    """

    noise_multiplier: float
    num_steps: int
    num_selected: int = 1
    released_rounds: int | None = None

    composes_with_own_kind: ClassVar[bool] = (
        True  # grids aligned by fedpriv.accounting.accountants.pld_grid
    )

    def __post_init__(self) -> None:
        s = self.noise_multiplier
        check(
            isinstance(s, (int, float)) and math.isfinite(s) and s > 0,
            "noise_multiplier",
            s,
            "must be a finite number > 0 (random allocation has no noiseless analysis)",
        )
        check(self.num_steps >= 1, "allocation_window", self.num_steps, "must be an integer >= 1")
        check(
            1 <= self.num_selected <= self.num_steps,
            "rounds_per_client",
            self.num_selected,
            f"must be in 1..allocation_window={self.num_steps} (k <= t)",
        )
        r = self.released_rounds
        check(
            r is None or 1 <= r <= self.num_steps,
            "released_rounds",
            r,
            f"must be in 1..allocation_window={self.num_steps}",
        )
        check(
            r is None or r == self.num_steps or self.num_selected == 1,
            "released_rounds",
            r,
            "a partial epoch is analysed for rounds_per_client=1 only (charge the whole epoch)",
        )

    @property
    def truncated(self) -> bool:
        """Whether only part of the epoch is released."""
        return self.released_rounds is not None and self.released_rounds < self.num_steps

    def pld(self) -> Any:
        """The dominating PLD of ONE epoch (dp-accounting object, cached per event)."""
        if not self.truncated:
            return _allocation_pld(self._key(), "DOMINATES")
        r = int(self.released_rounds)  # type: ignore[arg-type]
        return subsampled_allocation_pld(float(self.noise_multiplier), r, r / self.num_steps)

    def lower_pld(self, interval: float = LOWER_DISCRETIZATION) -> Any:
        """A PLD dominated by the true one: its composition gives a LOWER bound on ε
        (:mod:`fedpriv.accounting.core.lower_bound`). A whole epoch with k = 1: pld-accounting's
        lower PLD. Otherwise the first round alone, the Gaussian sampled at rate k/t: for k > 1
        pld-accounting's lower PLD bounds its decomposition into k allocations of t/k rounds,
        not the scheme (2 of 4 rounds, σ = 1, δ = 1e-3: 3.721, above a Monte Carlo 3.545;
        :func:`~fedpriv.accounting.core.lower_bound.epsilon_lower_bound` adds the Monte Carlo
        lower bound of the k-of-t pair for whole epochs).
        ``interval``: the first round's loss grid (pld-accounting's PLD keeps its own)."""
        if not self.truncated and self.num_selected == 1:
            return _allocation_pld(self._key(), "IS_DOMINATED")
        rate = self.num_selected / self.num_steps
        return optimistic_gaussian_pld(float(self.noise_multiplier), rate, interval)

    def _released(self) -> int:
        return self.num_steps if self.released_rounds is None else int(self.released_rounds)

    def _key(self) -> tuple[float, int, int]:
        return (float(self.noise_multiplier), self.num_steps, self.num_selected)


@lru_cache(maxsize=64)
def _allocation_pld(key: tuple[float, int, int], bound: str) -> Any:
    with warnings.catch_warnings():  # "numba not installed" ImportWarning: results unaffected
        warnings.simplefilter("ignore", ImportWarning)
        import PLD_accounting as pa

    sigma, num_steps, num_selected = key
    params = pa.PrivacyParams(sigma=sigma, num_steps=num_steps, num_selected=num_selected)
    grid = allocation_interval(sigma, num_steps, num_selected)
    config = pa.AllocationSchemeConfig(loss_discretization=grid)
    return pa.gaussian_allocation_pld(params=params, config=config, bound_type=pa.BoundType[bound])


@lru_cache(maxsize=64)
def subsampled_allocation_pld(sigma: float, num_steps: int, sampling_probability: float) -> Any:
    """The dominating PLD of the k = 1 allocation over ``num_steps`` rounds at noise σ, taking
    part with probability ``sampling_probability`` in (0, 1] (1: the allocation itself):
    pld-accounting's ``subsample_pld`` (remove ``(p·A + (1 − p)·Q, Q)``, add the mirror;
    Feldman, Shenfeld, arXiv:2602.17284, App. C). Hypotheses: the add/remove relation;
    k = 1; the client's round falls among the released ones with probability ``p`` and is
    then uniform over them (the module docstring's partial epoch)."""
    base = _allocation_pld((sigma, num_steps, 1), "DOMINATES")
    if sampling_probability == 1.0:
        return base
    import PLD_accounting as pa

    return pa.subsample_pld(pld=base, sampling_probability=sampling_probability)
