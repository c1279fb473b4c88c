"""Random check-ins with local randomizers: the privacy spec of a run and of the CLI.

:class:`CheckinSpec` (``privacy=checkin``) holds the local randomizer's budget and the
protocol the client binds (variant, slots, window, randomizer, clients, passes); it builds the
randomizer the clients and the server's dummy updates draw from
(:func:`fedpriv.accounting.loss_models.local_randomizer.calibrated_randomizer`) and the events the
run's
ledger composes (:mod:`fedpriv.accounting.checkin.events`). ``fedpriv-account checkin``
builds the same spec (:func:`run_cli`), so the CLI prints exactly the run's ε.

References
----------
Balle, Bell, Gascon, Kairouz, Thakurta, "Privacy Amplification via Random Check-Ins"
(arXiv:2007.06605), Theorems 3.2, 4.1, 4.3, 5.1 and Corollary 3.3.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

from fedpriv.accounting.checkin.events import (
    CheckinBound,
    CheckinEvent,
    LocalCapEvent,
    PoissonLocalEvent,
)
from fedpriv.accounting.checkin.gaussian import PASSES, CheckinNoise
from fedpriv.accounting.checkin.lower import COVERED, checkin_lower_bound
from fedpriv.accounting.core.calibrate import NoiseSearch
from fedpriv.accounting.core.cli_runner import Choice
from fedpriv.accounting.core.event import FedprivEvent
from fedpriv.accounting.core.lower_report import LowerBound
from fedpriv.accounting.core.params import CliKeys
from fedpriv.accounting.core.privacy_spec import EventRuns, PrivacySpec
from fedpriv.accounting.core.vocabulary import NeighboringRelation
from fedpriv.accounting.loss_models.local_randomizer import calibrated_randomizer, release_event
from fedpriv.accounting.samplers.checkin import THEOREMS, expected_dummy_updates, min_delta1
from fedpriv.common.errors import ConfigError, check
from fedpriv.common.validate import check_finite, parse_enum
from fedpriv.mechanisms.checkin_draw import CheckinVariant
from fedpriv.mechanisms.randomizers import LocalRandomizer, RandomizerKind

__all__ = ["ANALYSIS", "RUN_VARIANTS", "CheckinSpec"]

#: The variants a run executes (``shuffle`` is an analysis of ``fedpriv-account`` only).
RUN_VARIANTS = (
    CheckinVariant.FIXED,
    CheckinVariant.AVERAGED,
    CheckinVariant.SLIDING_WINDOW,
    CheckinVariant.POISSON,
)
#: Why ``lower_bound=true`` has no number for the other variants
#: (:meth:`CheckinSpec.lower_bound`).
NO_LOWER_BOUND = (
    "no realised pair of this variant's outputs is computed (local_epsilon bounds the central "
    "epsilon from above, not below); variant=fixed and variant=shuffle have one"
)
#: What ``lower_bound=true`` answers for ``fixed`` and ``shuffle``.
LOWER_BOUND_METHOD = (
    "optimistic PLD of a realised pair: the count of released reports beyond the target's "
    "shift (fedpriv.accounting.checkin.lower)"
)
#: The config group of each field a message names (the CLI names the bare key).
_PREFIX = {
    "variant": "client.",
    "num_slots": "client.",
    "window": "client.",
    "randomizer": "client.",
    "slot_sample_rate": "client.",
    "local_epsilon": "privacy.",
    "local_delta": "privacy.",
    "checkin_probability": "privacy.",
    "clipping_norm": "privacy.",
    "delta1": "privacy.",
    "delta2": "privacy.",
    "target_delta": "privacy.",
}


#: What a field must be, for the message refusing a non-finite value.
_FINITE = {
    "local_epsilon": "must be a finite number > 0",
    "local_delta": "must be a finite number in [0, 1)",
    "checkin_probability": "must be a finite number in (0, 1]",
    "clipping_norm": "must be a finite number > 0",
    "slot_sample_rate": "must be a finite number in (0, 1]",
    "delta1": "must be a finite number in (0, 1)",
    "delta2": "must be a finite number in (0, 1)",
}


def _prefixed(exc: ConfigError) -> ConfigError:
    """``exc`` with the config group added to a bare field name (``privacy.local_delta``)."""
    name = exc.field if "." in exc.field else _PREFIX.get(exc.field, "") + exc.field
    return ConfigError(name, exc.value, exc.allowed)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _cli_fields(values: dict[str, Any]) -> dict[str, Any]:
    """``num_slots`` (``num_clients`` for ``shuffle``, which ignores it; required otherwise)
    and ``randomizer`` (``gaussian`` when ``local_delta > 0``, else ``laplace``)."""
    variant, n = values["variant"], values["num_clients"]
    check(n >= 1, "num_clients", n, "must be an integer >= 1")
    slots = values["num_slots"]
    if slots is None:
        check(variant is CheckinVariant.SHUFFLE, "num_slots", None, "is required")
        slots = n
    randomizer = values["randomizer"]
    if randomizer is None:
        randomizer = (
            RandomizerKind.GAUSSIAN if values["local_delta"] > 0 else RandomizerKind.LAPLACE
        )
    return {"num_slots": slots, "randomizer": randomizer}


def _cli_epsilon(spec: Any, passes: int) -> float:
    """The ledger's ε after ``passes``; refused in one line when no bound is finite."""
    b = spec.bound_after(passes)
    if not math.isfinite(b.epsilon):
        reason = b.reason or "no bound is finite"
        raise ConfigError("target_delta", spec.target_delta, f"cannot be met: {reason}")
    return float(spec.epsilon(passes))


def _cli_report(spec: Any, passes: int) -> dict[str, Any]:
    """The variant and its theorem, which bound answered (and why not the theorem),
    ``epsilon_by_bound`` (``shuffle``: Theorem 5.1's and FMT21's), the mechanism, δ1 and the
    expected dummy updates."""
    out: dict[str, Any] = {
        "variant": spec.bound_variant.value,
        "theorem": spec.theorem,
        "local_epsilon": spec.local_epsilon,
        "local_delta": spec.local_delta,
        **spec.bound_after(passes).summary(),
    }
    out.update({k: v for k, v in spec.mechanism_summary().items() if k not in out})
    if spec.local_delta > 0.0 and spec.variant is not CheckinVariant.POISSON:
        if spec.delta1 is not None:
            out["delta1"] = spec.delta1
        elif isinstance(spec.pass_event(), CheckinEvent):
            out["delta1"] = min_delta1(spec.eps0, spec.local_delta)
    if spec.variant is not CheckinVariant.POISSON:
        out["expected_dummy_updates"] = spec.expected_empty_slots()
    if spec.variant is CheckinVariant.AVERAGED:
        out["note"] = (
            "pure-eps0 form of Theorem 4.1 reconstructed from the printed (eps0, delta0) form"
        )
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckinSpec(PrivacySpec):
    """One random check-in mechanism with local randomizers: validation, events, ε, calibration.

    Every client that takes part sends ``A_ldp(clip(g))``: its update clipped to
    ``clipping_norm`` L and randomized by the local randomizer to (``local_epsilon``,
    ``local_delta``) = (ε0, δ0) on its own. The amplified central ε of a pass comes from the
    paper's theorems (or the Poisson mixture of the baseline), composed over the passes.

    ``privacy.clipping_norm`` here is L, the norm bound of ONE released report (a client's
    clipped gradient): its l1 norm for the Laplace randomizer, its l2 norm for the Gaussian
    one. The randomizer's sensitivity is the replace-one distance of two clipped reports,
    ``2L`` in that norm; its noise is calibrated to ``2L`` (std ``sqrt(2) 2L/ε0`` for Laplace,
    the analytic Gaussian's σ at sensitivity ``2L`` for Gaussian).

    Parameters
    ----------
    local_epsilon : float or None
        ε0 > 0 of the local randomizer (finite); ``None`` with ``target_epsilon``: the run
        calibrates it (:meth:`calibrated`, the largest ε0 meeting the target).
    local_delta : float
        δ0: 0 for the laplace randomizer, in (0, 1) for the gaussian one.
    clipping_norm : float
        L > 0, the norm bound of one report (see above).
    checkin_probability : float
        p0 in (0, 1]; only ``fixed`` allows p0 < 1.
    delta1, delta2 : float or None
        The theorems' δ1 and Theorem 4.1's δ2 (default: optimised).
    variant : CheckinVariant or None
        The protocol (bound from ``client.variant``; ``shuffle`` for the CLI only). ``None``
        until the client binds its protocol (a config's spec: each field's own range is
        checked; the combinations once bound).
    num_slots : int
        m >= 1: slots of a pass (model steps of ``poisson``), or the sliding window's length
        (m <= n); ``shuffle`` ignores it (bound from ``client.num_slots``).
    randomizer : RandomizerKind
        The local randomizer (bound from ``client.randomizer``).
    window : (int, int) or None
        ``R_j`` for ``fixed`` / ``averaged``; only ``(1, m)`` is covered by the theorems
        (bound from ``client.window``).
    slot_sample_rate : float or None
        ``poisson`` only: the server's per-slot client sampling rate q (bound from
        ``client.slot_sample_rate``; ``None`` resolves to ``p0 / m``). Neither a record rate
        (``sample_rate``) nor a cohort rate (``client_sample_rate``).
    num_clients : int
        n >= 1 (bound from the run).
    num_rounds : int or None
        The run's passes (bound from the run): :meth:`summary` names the bound that answers
        after them; too many passes for the local cap are refused.
    (and the fields of :class:`~fedpriv.accounting.core.privacy_spec.PrivacySpec`; ``target_delta``
    defaults to 1e-6; ``accountant`` and ``conversion`` are recorded but do not change the
    answer: the check-in analyses give (ε, δ) directly, the ledger says ``own analysis``.)

    Raises
    ------
    ConfigError
        One line naming the field (``client.variant``, ``privacy.local_epsilon``, ...) for a
        non-finite or out-of-range value, an uncovered combination, or a (ε0, δ0)
        precondition that fails while the local cap cannot hold either.

    References
    ----------
    Balle, Bell, Gascon, Kairouz, Thakurta, "Privacy Amplification via Random Check-Ins"
    (arXiv:2007.06605), Theorems 3.2, 4.1, 4.3, 5.1 and Corollary 3.3.
    """

    family: ClassVar[str] = "checkin"
    calibrates: ClassVar[str] = "local_epsilon"
    bound_fields: ClassVar[tuple[str, ...]] = (
        *PrivacySpec.bound_fields,
        "variant",
        "num_slots",
        "randomizer",
        "window",
        "slot_sample_rate",
        "num_clients",
        "num_rounds",
    )
    cli: ClassVar[CliKeys] = CliKeys(
        doc="random check-ins with local randomizers: central epsilon after `repetitions` "
        "passes (Balle et al. Theorems 3.2, 4.1, 4.3, 5.1; shuffle also FMT21's numerical "
        "bound)",
        takes=("variant", "num_slots", "randomizer", "slot_sample_rate", "num_clients"),
        required=("variant", "num_clients"),
        defaults={"num_slots": None, "randomizer": None},
        renamed={"client_sample_rate": "slot_sample_rate"},
        rounds=PASSES,
        bind_rounds=True,
        delta_at_epsilon=True,
        derive=_cli_fields,
        epsilon=_cli_epsilon,
        report=_cli_report,
    )

    target_delta: float = 1e-6
    local_epsilon: float | None = 1.0
    local_delta: float = 0.0
    clipping_norm: float = 1.0
    checkin_probability: float = 1.0
    delta1: float | None = None
    delta2: float | None = None
    variant: CheckinVariant | None = None
    num_slots: int = 1
    randomizer: RandomizerKind = RandomizerKind.LAPLACE
    window: tuple[int, int] | None = None
    slot_sample_rate: float | None = None
    num_clients: int = 1
    num_rounds: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        set_ = object.__setattr__
        if self.variant is not None:
            set_(self, "variant", parse_enum(CheckinVariant, "client.variant", self.variant))
        set_(self, "randomizer", parse_enum(RandomizerKind, "client.randomizer", self.randomizer))
        eps0 = self.local_epsilon
        if eps0 is not None:
            eps0 = check_finite("privacy.local_epsilon", eps0, _FINITE["local_epsilon"])
            check(eps0 > 0, "privacy.local_epsilon", eps0, "must be > 0")
        set_(self, "local_epsilon", self.noise_or_target(eps0))
        for name in ("local_delta", "checkin_probability", "clipping_norm"):
            set_(self, name, check_finite(f"privacy.{name}", getattr(self, name), _FINITE[name]))
        for name in ("slot_sample_rate", "delta1", "delta2"):
            if getattr(self, name) is not None:
                field = _PREFIX[name] + name
                set_(self, name, check_finite(field, getattr(self, name), _FINITE[name]))
        d0 = self.local_delta
        check(0.0 <= d0 < 1.0, "privacy.local_delta", d0, "must be in [0, 1)")
        check(self.clipping_norm > 0, "privacy.clipping_norm", self.clipping_norm, "must be > 0")
        self._check_ranges()
        if self.variant is None:
            return  # a config's spec: the client binds its protocol (for_run), checked then
        self._check_protocol()
        if self.window is not None:
            self._check_window()
        self._check_mechanism(1.0 if self.local_epsilon is None else self.local_epsilon)
        if self.num_rounds is not None and self.local_epsilon is not None:
            self.check_passes(self.num_rounds)

    def _check_ranges(self) -> None:
        """Slots, clients, passes and p0, each on its own."""
        for name in ("num_slots", "num_clients"):
            v = getattr(self, name)
            check(_is_int(v) and v >= 1, _PREFIX.get(name, "") + name, v, "must be an integer >= 1")
        if self.num_rounds is not None:
            check(
                _is_int(self.num_rounds) and self.num_rounds >= 1,
                "num_rounds",
                self.num_rounds,
                "must be an integer >= 1",
            )
        p0 = self.checkin_probability
        check(0.0 < p0 <= 1.0, "privacy.checkin_probability", p0, "must be in (0, 1]")

    def _check_protocol(self) -> None:
        """The sliding window's ``m <= n`` and the Poisson baseline's rate."""
        set_ = object.__setattr__
        if self.bound_variant is CheckinVariant.SLIDING_WINDOW:
            check(
                self.num_slots <= self.num_clients,
                "client.num_slots",
                self.num_slots,
                f"must be <= num_clients={self.num_clients} for the sliding window "
                "(window of m slots, n - m + 1 updates)",
            )
        if self.bound_variant is CheckinVariant.POISSON:
            if self.slot_sample_rate is None:
                set_(self, "slot_sample_rate", self.checkin_probability / self.num_slots)
        elif self.slot_sample_rate is not None:
            check(
                False,
                "client.slot_sample_rate",
                self.slot_sample_rate,
                "is only used by client.variant=poisson",
            )

    def _check_window(self) -> None:
        """``window`` must be ``[1, m]`` (the only window Theorems 3.2 / 4.1 cover)."""
        w = list(self.window or [])
        check(
            self.bound_variant in (CheckinVariant.FIXED, CheckinVariant.AVERAGED),
            "client.window",
            w,
            f"must be null for client.variant={self.bound_variant.value} (the sliding window's "
            "R_j = {j..j+m-1} is set by num_slots)",
        )
        check(
            len(w) == 2 and all(_is_int(v) for v in w) and w[0] <= w[1],
            "client.window",
            w,
            "must be [first, last] slot numbers",
        )
        check(
            1 <= w[0] and w[1] <= self.num_slots,
            "client.window",
            w,
            f"lies outside the run's slots [1, {self.num_slots}]",
        )
        check(
            w == [1, self.num_slots],
            "client.window",
            w,
            f"must be the whole run [1, {self.num_slots}]: the check-in theorems cover only "
            "R_j = [m]",
        )
        object.__setattr__(self, "window", (int(w[0]), int(w[1])))

    def _check_mechanism(self, eps0: float) -> None:
        """The randomizer and the pass event at ``eps0`` (the given ε0, or a probe before
        calibration): a failed (ε0, δ0) precondition is refused unless the local cap holds."""
        calibrated_randomizer(self.randomizer, self.clipping_norm, eps0, self.local_delta)
        event = self._pass_event(eps0)
        if isinstance(event, LocalCapEvent):
            why = event.reason.split(f"local_delta={self.local_delta!r} ", 1)[-1]
            check(
                self.local_delta <= self.target_delta,
                "privacy.local_delta",
                self.local_delta,
                f"{why} ({self.theorem}), and the local cap needs local_delta <= "
                f"target_delta={self.target_delta:g}",
            )

    # -- the mechanism -------------------------------------------------------------------
    @property
    def neighboring_relation(self) -> NeighboringRelation:
        """Replace-one: neighbouring data sets differ in one client's data (the paper's)."""
        return NeighboringRelation.REPLACE_ONE

    @property
    def eps0(self) -> float:
        """ε0 as a number.

        Raises
        ------
        ConfigError
            Before calibration (``local_epsilon=None``).
        """
        check(
            self.local_epsilon is not None,
            "privacy.local_epsilon",
            None,
            "is not calibrated yet (the run calls calibrated(target_epsilon, num_rounds))",
        )
        return float(self.local_epsilon)  # type: ignore[arg-type]

    @property
    def bound_variant(self) -> CheckinVariant:
        """The protocol the client bound.

        Raises
        ------
        ConfigError
            Before the client binds it (``variant=None``).
        """
        check(
            self.variant is not None,
            "client.variant",
            None,
            "is not bound yet (the client binds its protocol: for_run(plan))",
        )
        return CheckinVariant(str(self.variant))

    @property
    def theorem(self) -> str:
        """The analysis behind the variant (``Theorem 3.2``, ..., or the Poisson mixture)."""
        if self.bound_variant is CheckinVariant.POISSON:
            return "Poisson mixture of local releases"
        return THEOREMS[self.bound_variant]

    @property
    def local_randomizer(self) -> LocalRandomizer:
        """The clients' (and dummies') randomizer, its noise calibrated to (ε0, δ0) at
        sensitivity ``2L``
        (:func:`fedpriv.accounting.loss_models.local_randomizer.calibrated_randomizer`)."""
        return calibrated_randomizer(
            self.randomizer, self.clipping_norm, self.eps0, self.local_delta
        )

    @property
    def steps(self) -> int:
        """Model-update slots per pass (``n - m + 1`` for the sliding window)."""
        if self.bound_variant is CheckinVariant.SLIDING_WINDOW:
            return self.num_clients - self.num_slots + 1
        return self.num_slots

    @property
    def normalizer(self) -> float:
        """The public constant dividing a client's release: 1.

        A client sends ``A_ldp(clip(g))``: its clipped gradient plus noise calibrated to the
        clipping norm, divided by nothing (no data size). The server's means (over a
        slot's check-ins, over a block's slots) divide reports that are each ε0-LDP on
        their own by counts that do not depend on any client's data: post-processing of
        the reports the theorem accounts.
        """
        return 1.0

    def expected_empty_slots(self) -> dict[str, float]:
        """Expected dummy updates (``skipped`` slots for ``averaged``) per pass and the
        paper's bound (:func:`fedpriv.accounting.samplers.checkin.expected_dummy_updates`)."""
        return expected_dummy_updates(
            self.bound_variant, self.num_clients, self.num_slots, self.checkin_probability
        )

    # -- events ------------------------------------------------------------------------
    def pass_event(self) -> FedprivEvent:
        """The central event of one pass (:class:`CheckinEvent`, :class:`PoissonLocalEvent`,
        or :class:`LocalCapEvent` when the (ε0, δ0) precondition fails)."""
        return self._pass_event(self.eps0)

    def _pass_event(self, eps0: float) -> FedprivEvent:
        if self.bound_variant is CheckinVariant.POISSON:
            r = calibrated_randomizer(self.randomizer, self.clipping_norm, eps0, self.local_delta)
            mu = r.sensitivity / r.noise_stddev if r.kind is RandomizerKind.GAUSSIAN else None
            return PoissonLocalEvent(eps0, self.slot_sample_rate or 0.0, self.num_slots, mu)
        try:
            return CheckinEvent(
                self.bound_variant,
                eps0,
                self.num_clients,
                self.num_slots,
                self.checkin_probability,
                self.local_delta,
                self.delta1,
                self.delta2,
            )
        except ConfigError as exc:
            if exc.field == "local_delta" and self.delta1 is None and "every delta1" in exc.allowed:
                return LocalCapEvent(
                    eps0,
                    self.local_delta,
                    reason=f"{self.theorem}: local_delta={self.local_delta!r} {exc.allowed}",
                )
            raise _prefixed(exc) from None

    def round_events(self) -> EventRuns:
        """One pass (fresh check-ins) per server round: ``[(pass_event, 1)]``."""
        return [(self.pass_event(), 1)]

    def local_events(self) -> EventRuns:
        """A client sends at most one randomized report per pass (its local DP)."""
        return [(release_event(self.local_randomizer), 1)]

    def check_passes(self, passes: int) -> None:
        """Refuse ``passes`` for which no bound holds at the target delta (local cap only).

        Raises
        ------
        ConfigError
            ``num_rounds`` when the pass event is a :class:`LocalCapEvent` and
            ``passes x local_delta > target_delta``.
        """
        event = self.pass_event()
        if isinstance(event, LocalCapEvent):
            check(
                passes * self.local_delta <= self.target_delta,
                "num_rounds",
                passes,
                f"is too many: {event.reason}, and the local cap needs num_rounds x "
                f"local_delta <= target_delta={self.target_delta:g}",
            )

    def bound_after(self, passes: int, target_delta: float | None = None) -> CheckinBound:
        """ε after ``passes`` passes with the bound that gives it (and why the theorem did
        not, when it did not), at ``target_delta`` (default: the spec's)."""
        delta = self.target_delta if target_delta is None else target_delta
        event = self.pass_event()
        if isinstance(event, (CheckinEvent, LocalCapEvent)):
            return event.bound(delta, passes)
        eps = event.epsilon(delta, passes)
        return CheckinBound(eps, self.theorem, "mixture over the number of reports")

    def epsilon(self, num_rounds: int, target_delta: float | None = None) -> float:
        """Central ε after ``num_rounds`` passes, composed through the run's ledger, at
        ``target_delta`` (default: the spec's)."""
        acc = self.accounting
        if target_delta is not None:
            acc = dataclasses.replace(acc, target_delta=target_delta)
        return acc.epsilon_after(self.round_events(), num_rounds)

    # -- calibration, reporting ----------------------------------------------------------
    def noise_search(self, target_epsilon: float, num_rounds: int) -> NoiseSearch:
        """The LARGEST ``local_epsilon`` (central ε increases with ε0, continuously) to 1e-12,
        a value outside every theorem's range counting as missing the target."""
        return NoiseSearch(
            increasing=True, rtol=1e-12, infeasible=(ConfigError, NotImplementedError)
        )

    def report(self, rounds: int) -> dict[str, float]:
        """Each client's local ε0 (and δ0) per release, printed with every pass."""
        out = {"local_epsilon0": self.eps0}
        if self.local_delta > 0:
            out["local_delta0"] = self.local_delta
        return out

    def lower_bound(self, num_rounds: int) -> LowerBound:
        """A lower bound on ε after ``num_rounds`` passes at ``target_delta``.

        ``fixed`` (Algorithm 1, each slot's update released, ``R_j = [m]``) and ``shuffle``:
        the realised pair of :func:`fedpriv.accounting.checkin.lower.checkin_lower_bound`
        (clients with linear losses, one client's clipped update moved; the count of reports
        beyond the shift), composed optimistically (Doroshenko et al. arXiv:2207.04380).
        Other variants: not available. The amplified ε of Balle et al. (arXiv:2007.06605,
        Theorems 3.2, 4.1, 4.3, 5.1) and of Feldman, McMillan, Talwar (arXiv:2012.12803) are
        upper bounds for every ε0-DP randomizer; the local ε0 is not a lower bound of the
        central ε, and FMT21's ``upperbound=False`` value bounds its clone pair's divergence
        (their upper bound) from below, not this protocol's ε.
        """
        variant = self.bound_variant
        if variant not in COVERED:
            return LowerBound.not_available(NO_LOWER_BOUND)
        bound = checkin_lower_bound(
            variant,
            self.local_randomizer,
            self.num_clients,
            self.num_slots,
            self.checkin_probability,
            num_rounds,
            self.target_delta,
        )
        return LowerBound(bound, LOWER_BOUND_METHOD)

    def mechanism_summary(self) -> dict[str, Any]:
        """The mechanism as ``fedpriv-account checkin`` prints it: the public normalizer, the
        variant, the randomizer with its budget, noise std and sensitivity, the theorem."""
        r = self.local_randomizer
        return {
            "normalizer": self.normalizer,
            "variant": self.bound_variant.value,
            "randomizer": r.kind.value,
            "local_epsilon": self.local_epsilon,
            "local_delta": self.local_delta,
            "noise_stddev": r.noise_stddev,
            "sensitivity": r.sensitivity,
            "theorem": self.theorem,
        }

    def extra_summary(self) -> dict[str, Any]:
        """The randomizer's noise std and sensitivity, the theorem, and which bound answers
        after the run's passes (the theorem or the local cap, with the reason)."""
        if self.variant is None:
            return {}
        if self.local_epsilon is None:
            return {"theorem": self.theorem}
        out = {k: v for k, v in self.mechanism_summary().items() if k != "normalizer"}
        if self.num_rounds:
            out.update(self.bound_after(self.num_rounds).summary())
        return out


# --------------------------------------------------------------------------- CLI
#: The registry's ``checkin``: local randomizers (default) or central Gaussian slot sums.
ANALYSIS = Choice(
    "noise",
    {
        CheckinNoise.LOCAL.value: f"{__name__}:CheckinSpec",
        CheckinNoise.CENTRAL_GAUSSIAN.value: "fedpriv.accounting.checkin.gaussian:"
        "CheckinGaussianSpec",
    },
    CheckinNoise.LOCAL.value,
    doc="random check-ins: noise=local (each report its own local randomizer) or "
    "noise=central_gaussian (clipped reports summed per slot plus one central Gaussian)",
)
