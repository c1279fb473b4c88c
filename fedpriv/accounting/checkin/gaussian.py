"""Random check-ins as participation, with central Gaussian noise on each slot's sum.

The fixed-window protocol (Algorithm 1's client side, ``R_j = [m]``): each of ``n`` clients,
with its own randomness, checks in with probability ``p0`` into ONE slot drawn uniformly from
the ``m`` slots of a pass. Slot ``i`` releases

    ``Σ_{j checked into i} clip_C(Δ_j) + N(0, σ² C² I)``

(L2 clip ``C``; the noise drawn by the trusted aggregator). Neighbours: add/remove one
client.

Random-allocation route (the one reported). Condition on the other clients' check-ins and
slots (the same in both worlds; by joint convexity of the hockey-stick divergence the bound
for every conditioning bounds the mixture). Shifted by the others' sums, the release without
the client is ``Q = N(0, σ² I_m)`` (per unit of ``C``), and with it

    ``(1 - p0) Q + p0 A``,  ``A = (1/m) Σ_i N(e_i, σ² I_m)``:

the client is absent from the whole pass with probability ``1 - p0`` and otherwise allocated
to one uniform slot, which is random allocation with ``t = m``, ``k = 1``. ``(A, Q)`` is the
pair whose dominating PLD ``gaussian_allocation_pld`` returns (both directions), so the pass
is the Poisson(``p0``)-subsampling of that mechanism and its PLD is
``PLD_accounting.subsample_pld(pld=<allocation PLD>, sampling_probability=p0)`` (the
subsampling transforms of dominating pairs, remove: ``((1 - p0) Q + p0 A, Q)``, add:
``(Q, (1 - p0) Q + p0 A)``). Passes draw fresh check-ins and compose by PLD self-composition.
A vector update of norm <= ``C`` is no worse than the scalar ``C`` (rotate it onto one axis;
the orthogonal coordinates are identical in both worlds).

``privacy.clipping_norm`` ``C`` is the L2 clip of one client's update, which is the add/remove
sensitivity of a slot's sum; σ (``privacy.noise_multiplier``) is the std of the slot's
Gaussian per unit of ``C``: the accounted release's noise multiplier.

Theorem route (the paper's). NOT APPLICABLE: Theorem 3.2 accounts Algorithm 1, where a slot
releases the local-randomizer report of ONE client chosen uniformly among those checked in
(its proof reduces to reservoir sampling of size 1 per slot, then to the replacement
algorithm ``A_rep``); Theorem 4.1 (every checked-in client sends) needs ``p0 = 1`` and a
report that is ``eps0``-DP on its own. A slot that sums several clients' clipped updates under
ONE central Gaussian is neither, so no (ε0, δ0) form of either theorem is claimed for it.
Both routes stay visible (:meth:`CheckinGaussianSpec.bounds`): the theorem's as ``None``
with its reason.

References
----------
Balle, Bell, Gascon, Kairouz, Thakurta, "Privacy Amplification via Random Check-Ins"
(arXiv:2007.06605), Algorithm 1, Theorem 3.2 and its proof (Appendix), Theorem 4.1.
Feldman, Shenfeld, "Efficient Privacy Loss Accounting for Subsampling and Random Allocation"
(arXiv:2602.17284), the random-allocation PLD (Sec. 4) and PLD subsampling (Appendix C,
Algorithms 8-10; ``pld-accounting`` 2.0 ``subsample_pld``).
Zhu, Dong, Wang, "Optimal Accounting of Differential Privacy via Characteristic Function"
(arXiv:2106.08567): Poisson subsampling of dominating pairs under add/remove.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from fedpriv.accounting.accountants.pld_grid import LOWER_DISCRETIZATION, optimistic_gaussian_pld
from fedpriv.accounting.core.calibrate import COARSE_SEARCH, NoiseSearch
from fedpriv.accounting.core.event import PldEvent
from fedpriv.accounting.core.lower_report import LowerBound
from fedpriv.accounting.core.params import CliKeys, Key
from fedpriv.accounting.core.privacy_spec import EventRuns, PrivacySpec, calibrated_value
from fedpriv.accounting.core.vocabulary import Accountant, NeighboringRelation
from fedpriv.accounting.loss_models.discrete_gaussian import DiscreteGaussianEvent
from fedpriv.accounting.samplers.random_allocation import (
    RandomAllocationEvent,
    subsampled_allocation_pld,
)
from fedpriv.common.errors import ConfigError, check
from fedpriv.common.validate import check_finite, check_positive
from fedpriv.mechanisms.lattice_gaussian import (
    add_lattice_gaussian,
    lattice_noise_multiplier,
    lattice_step,
)
from fedpriv.mechanisms.noise import gaussian_noise_arrays

if TYPE_CHECKING:
    import torch

__all__ = [
    "CheckinNoise",
    "ALLOCATION_BOUND",
    "LATTICE_BOUND",
    "THEOREM_BOUND",
    "THEOREM_NOT_APPLICABLE",
    "CheckinGaussianEvent",
    "CheckinGaussianSpec",
]


class CheckinNoise(StrEnum):
    """Where a check-in protocol's noise comes from (a closed set: each has its analysis).

    ``local``: each client's report is its own ε0-DP local randomizer (the paper's theorems,
    :mod:`fedpriv.accounting.checkin.spec`); ``central_gaussian``: clipped reports summed per
    slot plus one Gaussian by the trusted aggregator (this module).
    """

    LOCAL = "local"
    CENTRAL_GAUSSIAN = "central_gaussian"


#: The route that accounts a central-Gaussian check-in pass.
ALLOCATION_BOUND = "random allocation (t = m, k = 1), Poisson(p0)-subsampled PLD"
#: The route of ``privacy.secure_mode``'s lattice slot sums (:meth:`CheckinGaussianSpec.
#: pass_event`): no amplification by the allocation, one subsampled release per pass.
LATTICE_BOUND = (
    "discrete Gaussian zCDP (CKS20 Thm 4/15), one release per pass, Poisson(p0)-subsampled RDP"
)
#: The paper's route, reported as not applicable.
THEOREM_BOUND = "Theorem 3.2"
#: Why :data:`THEOREM_BOUND` is not claimed for a slot that sums several clients.
THEOREM_NOT_APPLICABLE = (
    "not applicable: Theorem 3.2 covers Algorithm 1, where each slot releases ONE checked-in "
    "client's local-randomizer report (its proof is reservoir sampling of size 1 per slot), "
    "and Theorem 4.1 needs p0 = 1 and reports that are eps0-DP on their own; a slot releasing "
    "the SUM of several clients' clipped updates plus one central Gaussian is covered by "
    "neither"
)


@dataclass(frozen=True)
class CheckinGaussianEvent(PldEvent):
    """One pass of fixed-window check-ins (``R_j = [m]``) with central Gaussian slot sums.

    Parameters
    ----------
    noise_multiplier : float
        σ > 0: std of each slot's Gaussian per unit of the clip norm ``C``.
    num_slots : int
        ``m >= 1`` slots (model updates) per pass.
    checkin_probability : float
        ``p0`` in (0, 1]: probability that a client checks in to the pass.

    Raises
    ------
    ConfigError
        For σ <= 0 or non-finite, ``m < 1``, or ``p0`` outside (0, 1].

    Notes
    -----
    ``count`` in :meth:`epsilon` / :meth:`delta` is the number of passes (fresh check-ins);
    the PLD (add/remove, dominating) of one pass is in :meth:`pld` (module docstring).
    """

    noise_multiplier: float
    num_slots: int
    checkin_probability: float = 1.0

    def __post_init__(self) -> None:
        s = self.noise_multiplier
        check(
            isinstance(s, (int, float)) and math.isfinite(s) and s > 0,
            "noise_multiplier",
            s,
            "must be a finite number > 0 (central check-ins have no noiseless analysis)",
        )
        m = self.num_slots
        check(
            isinstance(m, int) and not isinstance(m, bool) and m >= 1,
            "num_slots",
            m,
            "must be an integer >= 1",
        )
        p0 = self.checkin_probability
        check(
            isinstance(p0, (int, float)) and math.isfinite(p0) and 0.0 < p0 <= 1.0,
            "checkin_probability",
            p0,
            "must be in (0, 1]",
        )

    def pld(self) -> Any:
        """Dominating PLD of ONE pass (dp-accounting object; cached per parameters)."""
        return subsampled_allocation_pld(
            float(self.noise_multiplier), int(self.num_slots), float(self.checkin_probability)
        )

    def lower_pld(self, interval: float = LOWER_DISCRETIZATION) -> Any:
        """A PLD dominated by the pass's: with ``p0 = 1`` the allocation's lower PLD, else its
        first slot alone, the Gaussian sampled at ``p0 / m``
        (:func:`~fedpriv.accounting.accountants.pld_grid.optimistic_gaussian_pld`; loss grid
        ``interval``)."""
        sigma, p0 = float(self.noise_multiplier), float(self.checkin_probability)
        if p0 == 1.0:
            return RandomAllocationEvent(sigma, self.num_slots).lower_pld(interval)
        return optimistic_gaussian_pld(sigma, p0 / self.num_slots, interval)


_BARE = {"num_slots": "client.num_slots"}
#: ``repetitions``: the passes after which ε is answered (the run's ``num_rounds``; optimal
#: composition is O(passes), hence the cap).
PASSES = Key(
    name="repetitions",
    kind=int,
    default=1,
    limits={"ge": 1, "le": 100_000},
    doc="passes over the slots (the run's num_rounds)",
)
#: ``variant`` of ``noise=central_gaussian``: only the fixed window is accounted.
VARIANT_KEY = Key(
    name="variant",
    kind=str,
    default="fixed",
    choices=("fixed",),
    refusal="must be fixed with noise=central_gaussian (only R_j = [m] is accounted)",
    doc="the check-in window: only fixed (R_j = [m])",
)
#: What ``lower_bound=true`` answers (:meth:`CheckinGaussianEvent.lower_pld`, composed over
#: the passes by :func:`fedpriv.accounting.core.lower_bound.epsilon_lower_bound`).
LOWER_BOUND_METHOD = (
    "optimistic PLD of a realised pair: p0 = 1, the random allocation's lower PLD "
    "(arXiv:2602.17284); p0 < 1, a pass's first slot alone (Gaussian sampled at p0/m)"
)


def _cli_report(spec: Any, passes: int) -> dict[str, Any]:
    """The mechanism and every route's ε with the one that answered."""
    routes = {k: v for k, v in spec.bounds(passes).items() if k != "epsilon"}
    return {"noise": CheckinNoise.CENTRAL_GAUSSIAN.value, **spec.mechanism_summary(), **routes}


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckinGaussianSpec(PrivacySpec):
    """Fixed-window check-ins with central Gaussian slot sums: events, ε, calibration, noise.

    ``privacy.clipping_norm`` C is the L2 clip of each client's update: one client present
    or absent moves a slot's sum by at most C (add/remove sensitivity), and the trusted
    aggregator adds N(0, (σC)²) to every slot's sum.

    Parameters
    ----------
    noise_multiplier : float or None
        σ > 0 (noise std ``σ C`` on each slot's sum); ``None`` with ``target_epsilon``: the
        run calibrates it (:meth:`calibrated`).
    clipping_norm : float
        C > 0: L2 clip of each client's update (the sensitivity of a slot's sum).
    checkin_probability : float
        p0 in (0, 1].
    num_slots : int
        m >= 1 slots per pass (bound from ``client.num_slots``).
    num_clients : int or None
        n >= 1 (bound from the run; the public slot divisor ``max(1, n p0 / m)`` and the
        expected number of empty slots ``m (1 - p0/m)^n`` need it).
    num_rounds : int or None
        The run's passes (bound from the run): :meth:`summary` states every route's ε after
        them.
    lattice_noise : bool
        ``privacy.secure_mode``: each slot's sum is rounded to the lattice ``γℤ^d`` and a
        discrete Gaussian added (bound by the client; needs ``secure_mode`` and the ``rdp``
        accountant, which :func:`fedpriv.accounting.secure_mode.lattice_bound` sets).
    (and the fields of :class:`~fedpriv.accounting.core.privacy_spec.PrivacySpec`; the accountant
    must be ``pld`` for float noise (random allocation has no RDP curve here) and is ``rdp``
    for lattice noise (:meth:`pass_event`); the relation is add/remove.)

    Raises
    ------
    ConfigError
        One line naming the field, for an out-of-range value or an ``rdp`` accountant.

    References
    ----------
    Feldman, Shenfeld (arXiv:2602.17284), the random-allocation PLD and its subsampling;
    Balle et al. (arXiv:2007.06605), Algorithm 1 (the check-in draw).
    """

    family: ClassVar[str] = "checkin_gaussian"
    bound_fields: ClassVar[tuple[str, ...]] = (
        *PrivacySpec.bound_fields,
        "num_slots",
        "num_clients",
        "num_rounds",
        "lattice_noise",
    )
    cli: ClassVar[CliKeys] = CliKeys(
        doc="check-ins with central Gaussian slot sums (fixed window): epsilon after "
        "`repetitions` passes by the random-allocation PLD",
        takes=("num_slots", "num_clients"),
        required=("num_slots",),
        extra=(VARIANT_KEY,),
        rounds=PASSES,
        bind_rounds=True,
        report=_cli_report,
    )

    noise_multiplier: float | None = 1.0
    clipping_norm: float = 1.0
    checkin_probability: float = 1.0
    num_slots: int = 1
    num_clients: int | None = None
    num_rounds: int | None = None
    lattice_noise: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        set_ = object.__setattr__
        sigma = self.noise_or_target(self.noise_multiplier)
        if sigma is not None:
            check(
                sigma > 0,
                "privacy.noise_multiplier",
                sigma,
                "must be > 0 (central check-ins have no noiseless analysis)",
            )
        set_(self, "noise_multiplier", sigma)
        set_(self, "clipping_norm", check_positive("privacy.clipping_norm", self.clipping_norm))
        p0 = check_finite(
            "privacy.checkin_probability",
            self.checkin_probability,
            "must be a finite number in (0, 1]",
        )
        set_(self, "checkin_probability", p0)
        for name in ("num_clients", "num_rounds"):
            n = getattr(self, name)
            check(
                n is None or (isinstance(n, int) and not isinstance(n, bool) and n >= 1),
                name,
                n,
                "must be an integer >= 1",
            )
        self._check_accountant()
        try:  # validates σ, m, p0
            CheckinGaussianEvent(
                1.0 if sigma is None else sigma, self.num_slots, self.checkin_probability
            )
        except ConfigError as exc:
            name = _BARE.get(exc.field, f"privacy.{exc.field}")
            raise ConfigError(name, exc.value, exc.allowed) from None

    def _check_accountant(self) -> None:
        """PLD for float noise; RDP for lattice noise (secure mode, which binds it)."""
        check(
            self.accountant is Accountant.PLD or self.secure_mode,
            "privacy.accountant",
            self.accountant.value,
            "must be pld for central-Gaussian check-ins (random-allocation PLD; with "
            "privacy.secure_mode=true the lattice slot sums are accounted by rdp)",
        )
        check(
            isinstance(self.lattice_noise, bool)
            and (
                not self.lattice_noise or (self.secure_mode and self.accountant is Accountant.RDP)
            ),
            "privacy.lattice_noise",
            self.lattice_noise,
            "needs privacy.secure_mode=true and privacy.accountant=rdp (the discrete Gaussian "
            "has no random-allocation PLD here)",
        )

    # ---- the mechanism -------------------------------------------------------------------
    @property
    def sigma(self) -> float:
        """``noise_multiplier`` as a number (refused before calibration)."""
        return calibrated_value("noise_multiplier", self.noise_multiplier)

    @property
    def noise_stddev(self) -> float:
        """Std ``σ C`` of the Gaussian added to each slot's sum (units of the update)."""
        return self.sigma * float(self.clipping_norm)

    @property
    def slot_divisor(self) -> float:
        """Public constant dividing a slot's noisy sum: the expected check-ins per slot
        ``max(1, n p0 / m)`` (1 without ``n``); never the realized count."""
        if self.num_clients is None:
            return 1.0
        return max(1.0, self.num_clients * self.checkin_probability / self.num_slots)

    def slot_noise(
        self, shapes: Mapping[str, tuple[int, ...]], generator: torch.Generator
    ) -> dict[str, np.ndarray]:
        """The Gaussian the trusted aggregator adds to ONE slot's sum: ``N(0, (σ C)² I)`` per
        entry of each shape (float64 numpy), drawn from ``generator``
        (:func:`fedpriv.mechanisms.noise.gaussian_noise_arrays`)."""
        return gaussian_noise_arrays(shapes, self.noise_stddev, generator)

    def lattice_release(
        self, total: Mapping[str, np.ndarray], rng: np.random.Generator | None = None
    ) -> dict[str, np.ndarray]:
        """ONE slot's release with :attr:`lattice_noise`, before the public division:
        ``γ (round(total/γ) + K)``, ``total`` the exact sum of the slot's clipped updates,
        ``K ~ N_ℤ(0, (σC/γ)²)`` per entry, ``γ`` the lattice step for sensitivity ``C`` and
        the total dimension (``rng``: OS entropy when ``None``).

        Raises
        ------
        ConfigError
            Without :attr:`lattice_noise` (the float path adds :meth:`slot_noise`).
        """
        check(self.lattice_noise, "privacy.lattice_noise", self.lattice_noise, "must be true")
        dim = sum(int(np.size(v)) for v in total.values())
        step = lattice_step(float(self.clipping_norm), dim)
        return add_lattice_gaussian(total, self.noise_stddev, step, rng or np.random.default_rng())

    def expected_empty_slots(self) -> float | None:
        """``m (1 - p0/m)^n`` slots per pass that release noise only (None without ``n``)."""
        if self.num_clients is None:
            return None
        m, p0 = self.num_slots, self.checkin_probability
        return float(m * (1.0 - p0 / m) ** self.num_clients)

    # ---- events ----------------------------------------------------------------------
    def pass_event(self) -> CheckinGaussianEvent | DiscreteGaussianEvent:
        """The ledger event of one pass: the random-allocation PLD event, or with
        :attr:`lattice_noise` the discrete Gaussian of ONE release per pass at rate ``p0``.

        Why the lattice event bounds a pass (add/remove one client, ``C = 1``): condition on
        the other clients' check-ins and slots (the same in both worlds). Given that the
        client checks in and picks slot ``J``, the pass releases ``m`` slot sums, each with
        fresh discrete Gaussian noise, of which only slot ``J`` moves, by at most
        ``C(1 + 2^-20)`` after rounding (the slots run one after another on models updated by
        the earlier releases: by adaptive RDP composition the other slots add nothing): for
        each ``J`` that is ``ρ = 1/(2z²)``-zCDP with ``z`` =
        :func:`~fedpriv.mechanisms.lattice_gaussian.lattice_noise_multiplier` (σ) (Canonne,
        Kamath, Steinke 2020, arXiv:2004.00010, Theorems 4 and 15: integer-valued query,
        independent coordinates), in both directions (the mechanism is symmetric). The
        uniform ``J`` is a mixture; by the joint convexity of ``exp((α-1) D_α)`` the mixture's
        Rényi divergence (either direction) is at most the largest ``J``'s. So the pass
        without its check-in draw is a mechanism with RDP ``α/(2z²)`` in both directions on
        the checked-in clients, which the client joins with probability ``p0``
        independently of everyone: the Poisson-subsampled RDP bound (Steinke 2022,
        arXiv:2210.00597; hypothesis: the base curve bounds both orders of the divergence)
        applies at rate ``p0``
        (:class:`~fedpriv.accounting.loss_models.discrete_gaussian.DiscreteGaussianEvent`). It
        forgoes
        the amplification by the allocation over the ``m`` slots (no RDP analysis of random
        allocation for the discrete Gaussian is used), so it is above the float route's ε.
        """
        if self.lattice_noise:
            return DiscreteGaussianEvent(
                lattice_noise_multiplier(self.sigma), float(self.checkin_probability)
            )
        return CheckinGaussianEvent(self.sigma, self.num_slots, self.checkin_probability)

    def round_events(self) -> EventRuns:
        """One pass (fresh check-ins) per server round: ``[(pass_event, 1)]``."""
        return [(self.pass_event(), 1)]

    def epsilon(self, num_rounds: int, target_delta: float | None = None) -> float:
        """ε after ``num_rounds`` passes at ``target_delta`` (default: the spec's), by the
        ledger (the reported, tighter valid route: random allocation)."""
        acc = self.accounting
        if target_delta is not None:
            acc = dataclasses.replace(acc, target_delta=target_delta)
        return acc.epsilon_after(self.round_events(), num_rounds)

    def bounds(self, passes: int, target_delta: float | None = None) -> dict[str, Any]:
        """Every route with its ε (``None``: not applicable) and which one answered.

        Returns
        -------
        dict
            ``{"epsilon", "bound", "composition", "epsilon_by_bound": {route: ε or None},
            "bound_reason": {route: why not}, "neighboring_relation"}`` (results.json, CLI).
        """
        eps = self.epsilon(passes, target_delta)
        bound = LATTICE_BOUND if self.lattice_noise else ALLOCATION_BOUND
        how = "RDP " if self.lattice_noise else "PLD self-"
        return {
            "epsilon": eps,
            "bound": bound,
            "composition": f"{how}composition over passes" if passes > 1 else "single pass",
            "epsilon_by_bound": {bound: eps, THEOREM_BOUND: None},
            "bound_reason": {THEOREM_BOUND: THEOREM_NOT_APPLICABLE},
            "neighboring_relation": NeighboringRelation.ADD_REMOVE.value,
        }

    # ---- calibration, reporting ------------------------------------------------------
    def noise_search(self, target_epsilon: float, num_rounds: int) -> NoiseSearch:
        """A 0.3 % tolerance; unless the noise is lattice, a bracket from the σ of the
        Poisson-subsampled Gaussian at rate ``p0 / m`` over ``m x passes`` steps
        (dp-accounting's fast PLD), widened by 25 % each way and checked before use."""
        hint = None if self.lattice_noise else self._hint(target_epsilon, num_rounds)
        return NoiseSearch(hint=hint, rtol=3e-3)

    def _hint(self, target: float, passes: int) -> tuple[float, float]:
        from dp_accounting import dp_event
        from dp_accounting.pld import pld_privacy_accountant

        q = self.checkin_probability / self.num_slots
        steps = self.num_slots * passes
        delta = self.target_delta

        def eps_of(z: float) -> float:
            acc = pld_privacy_accountant.PLDAccountant()
            acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), steps)
            return float(acc.get_epsilon(delta))

        z = COARSE_SEARCH.solve(eps_of, target, "privacy.noise_multiplier")
        return (z / 1.25, z * 1.25)

    def lower_bound(self, num_rounds: int) -> LowerBound:
        """:data:`LOWER_BOUND_METHOD` after ``num_rounds`` passes at ``target_delta``.

        Hypotheses: add/remove neighbours; one client whose clipped update has norm C in every
        pass, the others 0, so every pass releases the pair of :meth:`CheckinGaussianEvent.pld`.
        With ``p0 = 1`` the random allocation's lower PLD (Feldman, Shenfeld arXiv:2602.17284);
        with ``p0 < 1`` the first slot alone, a post-processing of the pass, which is the
        Gaussian Poisson-sampled at ``p0/m``; discretized optimistically (Doroshenko et al.
        arXiv:2207.04380) by :func:`fedpriv.accounting.core.lower_bound.epsilon_lower_bound`.
        """
        events = [(self.pass_event(), num_rounds)]
        return LowerBound.of_events(events, self.target_delta, LOWER_BOUND_METHOD)

    def mechanism_summary(self) -> dict[str, Any]:
        """The mechanism: variant, noise, σ and its std, sensitivity, slots, p0 and the
        expected empty slots (when ``n`` is known)."""
        out: dict[str, Any] = {
            "variant": "fixed",
            "noise": CheckinNoise.CENTRAL_GAUSSIAN.value,
            "mechanism": "discrete_gaussian" if self.lattice_noise else "gaussian",
            "noise_multiplier": self.sigma,
            "noise_stddev": self.noise_stddev,
            "sensitivity": float(self.clipping_norm),
            "num_slots": self.num_slots,
            "checkin_probability": float(self.checkin_probability),
        }
        empty = self.expected_empty_slots()
        if empty is not None:
            out["expected_empty_slots"] = empty
        return out

    def extra_summary(self) -> dict[str, Any]:
        """The mechanism and, after the run's passes, both routes (random allocation's ε,
        Theorem 3.2 not applicable with its reason) and which one answered."""
        if self.noise_multiplier is None:
            return {"variant": "fixed", "noise": CheckinNoise.CENTRAL_GAUSSIAN.value}
        out = self.mechanism_summary()
        if self.num_rounds:
            out.update({k: v for k, v in self.bounds(self.num_rounds).items() if k != "epsilon"})
        return out
