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
from collections.abc import Mapping
from typing import Any, ClassVar

from fedpriv.accounting.accountants import gdp
from fedpriv.accounting.checkin.events import (
    CheckinBound,
    CheckinEvent,
    LocalCapEvent,
    PoissonLocalEvent,
)
from fedpriv.accounting.checkin.gaussian import CheckinNoise
from fedpriv.accounting.checkin.gaussian import run_cli as central_gaussian_cli
from fedpriv.accounting.checkin.lower import COVERED, checkin_lower_bound
from fedpriv.accounting.core.ledger import FedprivEvent
from fedpriv.accounting.core.lower_report import (
    LOWER_BOUND_KEY,
    lower_bound_entry,
    wants_lower_bound,
)
from fedpriv.accounting.core.params import Params
from fedpriv.accounting.core.privacy_spec import EventRuns, PrivacySpec
from fedpriv.accounting.core.vocabulary import Accountant, Conversion, NeighboringRelation
from fedpriv.accounting.loss_models.local_randomizer import calibrated_randomizer, release_event
from fedpriv.accounting.samplers.checkin import THEOREMS, expected_dummy_updates, min_delta1
from fedpriv.common.errors import ConfigError, check
from fedpriv.common.validate import check_finite, parse_enum
from fedpriv.mechanisms.checkin_draw import CheckinVariant
from fedpriv.mechanisms.randomizers import LocalRandomizer, RandomizerKind

__all__ = ["RUN_VARIANTS", "KEYS", "CheckinSpec", "run_cli"]

#: The variants a run executes (``shuffle`` is an analysis of ``fedpriv-account`` only).
RUN_VARIANTS = (
    CheckinVariant.FIXED,
    CheckinVariant.AVERAGED,
    CheckinVariant.SLIDING_WINDOW,
    CheckinVariant.POISSON,
)
#: ``fedpriv-account checkin`` keys (``noise=central_gaussian``: those of
#: :data:`fedpriv.accounting.checkin.gaussian.KEYS`).
KEYS = (
    "noise",
    "variant",
    "local_epsilon",
    "local_delta",
    "num_clients",
    "num_slots",
    "checkin_probability",
    "randomizer",
    "clipping_norm",
    "slot_sample_rate",
    "delta1",
    "delta2",
    "repetitions",
    "target_epsilon",
    "target_delta",
    "accountant",
    "conversion",
    LOWER_BOUND_KEY,
)
#: Why ``lower_bound=true`` has no number for the other variants (see :func:`_lower_bound`).
NO_LOWER_BOUND = (
    "no realised pair of this variant's outputs is computed (local_epsilon bounds the central "
    "epsilon from above, not below); variant=fixed and variant=shuffle have one"
)
#: What ``lower_bound=true`` answers for ``fixed`` and ``shuffle``.
LOWER_BOUND_METHOD = (
    "optimistic PLD of a realised pair: the count of released reports beyond the target's "
    "shift (fedpriv.accounting.checkin.lower)"
)
#: The config group of each field a message names (the CLI strips it: :func:`_bare`).
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


def _bare(exc: ConfigError) -> ConfigError:
    """``exc`` with the config group removed (the CLI's key names)."""
    group, _, rest = exc.field.partition(".")
    name = rest if rest and group in ("privacy", "client") else exc.field
    return ConfigError(name, exc.value, exc.allowed)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


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

    # -- construction ------------------------------------------------------------------
    @classmethod
    def from_params(cls, p: Params) -> CheckinSpec:
        """The spec of ``fedpriv-account checkin key=value ...``.

        Keys: ``variant``, ``local_epsilon`` (1 when absent: the CLI calibrates it to
        ``target_epsilon``), ``local_delta`` (0), ``num_clients``, ``num_slots`` (not for
        shuffle), ``checkin_probability`` (1), ``randomizer`` (default ``gaussian`` when
        ``local_delta > 0``, else ``laplace``), ``clipping_norm`` (1), ``slot_sample_rate``
        (poisson), ``delta1``, ``delta2``, ``target_delta`` (1e-5 when absent),
        ``accountant``, ``conversion``.

        Raises
        ------
        ConfigError
            Naming the CLI key (no ``privacy.`` or ``client.`` prefix).
        """
        variant = parse_enum(CheckinVariant, "variant", p.str("variant"))
        eps0 = p.float("local_epsilon", 1.0, gt=0.0)
        local_delta = p.float("local_delta", 0.0, ge=0.0, lt=1.0)
        n = p.int("num_clients", ge=1)
        m = p.int("num_slots", n if variant is CheckinVariant.SHUFFLE else None, ge=1)
        if m is None:
            raise ConfigError("num_slots", None, "is required")
        try:
            return cls(
                variant=variant,
                local_epsilon=eps0,
                local_delta=local_delta,
                num_clients=n,
                num_slots=m,
                checkin_probability=p.float("checkin_probability", 1.0, gt=0.0, le=1.0),
                randomizer=parse_enum(
                    RandomizerKind,
                    "randomizer",
                    p.str("randomizer", "gaussian" if local_delta > 0 else "laplace"),
                ),
                clipping_norm=p.float("clipping_norm", 1.0, gt=0.0),
                slot_sample_rate=p.float("slot_sample_rate", None, gt=0.0, le=1.0),
                delta1=p.float("delta1", None, gt=0.0, lt=1.0),
                delta2=p.float("delta2", None, gt=0.0, lt=1.0),
                accountant=parse_enum(Accountant, "accountant", p.str("accountant", "pld")),
                conversion=parse_enum(Conversion, "conversion", p.str("conversion", "default")),
                target_delta=p.float("target_delta", 1e-5, gt=0.0, lt=1.0),
            )
        except ConfigError as exc:
            raise _bare(exc) from None

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
    def calibrated(self, target_epsilon: float, num_rounds: int) -> CheckinSpec:
        """A NEW spec whose ``local_epsilon`` is the largest with central ε <= the target.

        Bisection (60 geometric steps) on ε0 of the ε the run's ledger reports after
        ``num_rounds`` passes at ``target_delta``; the ε is continuous and increasing in ε0,
        so the result is within 1 % of the target.

        Raises
        ------
        ConfigError
            ``privacy.target_epsilon`` when it is not finite and > 0, or when even
            ``ε0 = 1e-6`` misses it.
        """
        target = check_finite(
            "privacy.target_epsilon", target_epsilon, "must be a finite number > 0"
        )
        check(target > 0, "privacy.target_epsilon", target_epsilon, "must be > 0")

        def eps_at(e0: float) -> float:
            try:
                return self.with_noise(e0).epsilon(num_rounds)
            except (ConfigError, NotImplementedError):
                return math.inf

        lo, hi = 1e-6, 1.0
        check(
            eps_at(lo) <= target,
            "privacy.target_epsilon",
            target_epsilon,
            f"cannot be met even with local_epsilon={lo}",
        )
        while eps_at(hi) <= target:
            lo, hi = hi, 2 * hi
            if hi > 1e6:
                break
        for _ in range(60):
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if eps_at(mid) <= target else (lo, mid)
        return self.with_noise(lo, target)

    def report(self, rounds: int) -> dict[str, float]:
        """Each client's local ε0 (and δ0) per release, printed with every pass."""
        out = {"local_epsilon0": self.eps0}
        if self.local_delta > 0:
            out["local_delta0"] = self.local_delta
        return out

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
def run_cli(params: Mapping[str, Any]) -> dict[str, Any]:
    """``fedpriv-account checkin``: keys ``variant``, ``local_epsilon`` (omit it, with
    ``target_epsilon`` and ``target_delta``, to calibrate it), ``local_delta``,
    ``num_clients``, ``num_slots``, ``checkin_probability``, ``randomizer``,
    ``clipping_norm``, ``slot_sample_rate`` (poisson), ``delta1``, ``delta2``,
    ``repetitions`` (the run's ``num_rounds``, 1), ``target_delta`` and/or
    ``target_epsilon``, ``accountant``, ``conversion`` (:meth:`CheckinSpec.from_params`),
    ``lower_bound`` (true: ``epsilon_lower_bound``, for ``fixed`` and ``shuffle`` a realised
    pair's, else :data:`NO_LOWER_BOUND`: :func:`_lower_bound`).

    ``noise``: ``local`` (default, the keys above) or ``central_gaussian``: the slots
    release clients' clipped sums plus one central Gaussian, and
    :func:`fedpriv.accounting.checkin.gaussian.run_cli` answers (its keys).

    Returns
    -------
    dict
        ``epsilon``, ``delta``, ``local_epsilon``, ``theorem``, ``bound`` (which bound
        answered), ``bound_reason`` (why the theorem did not, when it did not),
        ``epsilon_by_bound`` (``shuffle``, pure ε0: Theorem 5.1's and the FMT21
        numerical ε, each composed over the repetitions), ``composition``,
        ``expected_dummy_updates``, the mechanism (``normalizer``, noise) and ``delta1`` when
        used; with ``calibrated = local_epsilon`` when calibrated.

    Raises
    ------
    ConfigError
        On unknown keys, bad values, uncovered combinations or a failed precondition.
    NotImplementedError
        When no bound holds at the requested delta (one line).
    """
    noise = parse_enum(CheckinNoise, "noise", params.get("noise", CheckinNoise.LOCAL.value))
    if noise is CheckinNoise.CENTRAL_GAUSSIAN:  # central noise: its own analysis
        return central_gaussian_cli(params)
    params = {k: v for k, v in params.items() if k != "noise"}
    if "client_sample_rate" in params:
        raise ConfigError(
            "client_sample_rate",
            params["client_sample_rate"],
            "was renamed: use slot_sample_rate (docs/migration.md)",
        )
    p = Params(params, "checkin", KEYS)
    calibrate = not p.has("local_epsilon")
    spec = CheckinSpec.from_params(p)
    reps = p.int("repetitions", 1, ge=1, le=100_000)  # optimal composition is O(reps)
    eps_t, delta_t = gdp.cli_targets(p)
    lower = wants_lower_bound(p)
    p.finish()
    if calibrate:
        check(
            eps_t is not None and delta_t is not None,
            "local_epsilon",
            None,
            "is required (or give target_epsilon and target_delta to calibrate it)",
        )
    try:
        spec.check_passes(reps)
        if calibrate:
            spec = spec.calibrated(eps_t, reps)  # type: ignore[arg-type]
    except ConfigError as exc:
        raise _bare(exc) from None
    out: dict[str, Any] = {"analysis": "checkin"}
    if calibrate:
        out.update(calibrated="local_epsilon", target_epsilon=eps_t)
    out.update(_answer(spec, reps, eps_t, delta_t))
    if lower:
        out.update(_lower_bound(spec, reps, out["delta"]))
    return out


def _lower_bound(spec: CheckinSpec, passes: int, delta: float) -> dict[str, Any]:
    """``epsilon_lower_bound`` after ``passes`` passes at ``delta``.

    ``fixed`` (Algorithm 1, each slot's update released, ``R_j = [m]``) and ``shuffle``: the
    realised pair of :func:`fedpriv.accounting.checkin.lower.checkin_lower_bound` (clients with
    linear losses, one client's clipped update moved; the count of reports beyond the shift),
    composed optimistically (Doroshenko et al. arXiv:2207.04380). Other variants: not
    available. The amplified ε of Balle et al. (arXiv:2007.06605, Theorems 3.2, 4.1, 4.3,
    5.1) and of Feldman, McMillan, Talwar (arXiv:2012.12803) are upper bounds for every
    ε0-DP randomizer; the local ε0 is not a lower bound of the central ε, and FMT21's
    ``upperbound=False`` value bounds its clone pair's divergence (their upper bound) from
    below, not this protocol's ε.
    """
    variant = spec.bound_variant
    if variant not in COVERED:
        return lower_bound_entry(None, NO_LOWER_BOUND)
    bound = checkin_lower_bound(
        variant,
        spec.local_randomizer,
        spec.num_clients,
        spec.num_slots,
        spec.checkin_probability,
        passes,
        delta,
    )
    return lower_bound_entry(bound, LOWER_BOUND_METHOD)


def _answer(
    spec: CheckinSpec, reps: int, eps_t: float | None, delta_t: float | None
) -> dict[str, Any]:
    """The CLI's answer for ``spec`` after ``reps`` passes: ε at ``delta_t`` (with the bound
    that answered), else δ at ``eps_t``; the mechanism, δ1, the expected dummies."""
    out: dict[str, Any] = {
        "variant": spec.bound_variant.value,
        "theorem": spec.theorem,
        "local_epsilon": spec.local_epsilon,
        "local_delta": spec.local_delta,
        "repetitions": reps,
    }
    if delta_t is not None:
        b = spec.bound_after(reps, delta_t)
        if not math.isfinite(b.epsilon):
            reason = b.reason or "no bound is finite"
            raise ConfigError("target_delta", delta_t, f"cannot be met: {reason}")
        out.update(epsilon=spec.epsilon(reps, delta_t), delta=delta_t, **b.summary())
    else:
        assert eps_t is not None
        out.update(epsilon=eps_t, delta=spec.pass_event().delta(eps_t, reps))
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
