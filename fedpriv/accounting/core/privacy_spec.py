"""The privacy spec: one typed, frozen, validated object per mechanism family.

Every family implements :class:`PrivacySpec` with the same signatures: its events for one
round, for one client's own release and for a round that only ``k`` clients' noise reached;
``calibrated(target_epsilon, num_rounds)`` returning a NEW spec (written once, here: a family
describes its search with :meth:`PrivacySpec.noise_search`); a summary for
``results.json``; construction from ``fedpriv-account``'s parameters. The spec that states a
run's events also states the noise its client algorithm draws (noise std, clip, normalizer),
so the accountant composes exactly what was drawn.

Where a spec comes from:

- ``conf/privacy/<family>.yaml`` is a structured config whose ``_target_`` is the family's
  spec (:func:`config_schema` makes its schema from the spec's fields); the run builds the
  spec once, validated, before anything is written.
- The client algorithm binds what only it and the run know (local steps, the nominal cohort,
  the public normalizer, ...: :attr:`PrivacySpec.bound_fields`) with :meth:`PrivacySpec.bound`,
  and holds the bound spec.
- Ray workers receive the bound spec as a typed payload (:mod:`fedpriv.common.payload`) and
  decode it into the same class, validated again.
- ``fedpriv-account`` builds the same specs from its parameters (:meth:`from_params`): its
  keys are the spec's fields (:mod:`fedpriv.accounting.core.cli_runner`), plus what the
  family declares in :attr:`PrivacySpec.cli`.

References
----------
Google's dp_accounting (``dp_event.py``): events apart from accountants; jax_privacy's
``BandMFConfig`` (``execution_plan.py``): one frozen plan feeding the noise and the event,
``calibrate`` returning a new config.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, Self

import numpy as np

from fedpriv.accounting.core.accounting_spec import AccountingSpec
from fedpriv.accounting.core.calibrate import NoiseSearch
from fedpriv.accounting.core.lower_report import LowerBound
from fedpriv.accounting.core.params import CliKeys
from fedpriv.accounting.core.vocabulary import (
    Accountant,
    Conversion,
    NeighboringRelation,
    NoiseSource,
)
from fedpriv.common.errors import check
from fedpriv.common.schema import dataclass_schema, plain
from fedpriv.common.validate import check_finite, check_positive, parse_enum
from fedpriv.mechanisms.participation import Participation

#: A family's events: ``[(event, count), ...]`` (dp-accounting ``DpEvent`` or ``FedprivEvent``).
EventRuns = list[tuple[Any, int]]


class UnaccountableRound(NotImplementedError):
    """A round the spec cannot account (e.g. too few clients' noise reached the sum): the run
    fails the round instead of releasing it."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrivacySpec(ABC):
    """What a run releases and how it is accounted (the base of every family's spec).

    Parameters
    ----------
    target_delta : float
        δ at which ε is reported, in (0, 1).
    target_epsilon : float, optional
        Calibrate the family's noise parameter to this ε after ``num_rounds`` rounds (the run
        calls :meth:`calibrated`; the noise parameter must then be ``None``).
    accountant : {"pld", "rdp"}
        How events compose (dp-accounting's PLD, tight, or RDP).
    conversion : {"default", "mironov"}
        RDP → (ε, δ) conversion; ``mironov`` (the third paper's numbers) needs RDP.
    stop_at_epsilon : float, optional
        The run stops before a round that would take ε above this, > 0.
    secure_mode : bool
        Noise and every other random draw from OS entropy (``noise_source=secure``) instead of
        the run's ``seed`` (``seeded``: reproducible, for simulations only).
    calibrated_from_target_epsilon : float, optional
        Set by :meth:`calibrated`: the target the noise was calibrated to (bound, not a config
        key).

    Raises
    ------
    ConfigError
        For a value out of range, naming ``privacy.<field>``.
    """

    #: The option of the ``privacy`` config group (``conf/privacy/<family>.yaml``).
    family: ClassVar[str] = ""
    #: Fields the client algorithm and the run bind (:meth:`bound`); not config keys.
    bound_fields: ClassVar[tuple[str, ...]] = ("calibrated_from_target_epsilon",)
    #: The name of the family's noise parameter that :meth:`calibrated` solves for.
    calibrates: ClassVar[str] = "noise_multiplier"
    #: The run charges :meth:`prefix_events` from the last charged round instead of one round's
    #: events (correlated noise: what is accounted is the released prefix).
    prefix_accounted: ClassVar[bool] = False
    #: The mechanism is built for the run's ``num_rounds`` (a resumed run cannot change it).
    fixed_horizon: ClassVar[bool] = False
    #: ``fedpriv-account``: what the family's analysis adds to the keys its fields give.
    cli: ClassVar[CliKeys] = CliKeys()

    target_delta: float = 1e-5
    target_epsilon: float | None = None
    accountant: Accountant = Accountant.PLD
    conversion: Conversion = Conversion.DEFAULT
    stop_at_epsilon: float | None = None
    secure_mode: bool = False
    calibrated_from_target_epsilon: float | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "accountant", parse_enum(Accountant, "privacy.accountant", self.accountant))
        set_(self, "conversion", parse_enum(Conversion, "privacy.conversion", self.conversion))
        for name in ("target_epsilon", "stop_at_epsilon", "calibrated_from_target_epsilon"):
            value = getattr(self, name)
            if value is not None:
                set_(self, name, check_positive(f"privacy.{name}", value))
        check(
            isinstance(self.secure_mode, bool),
            "privacy.secure_mode",
            self.secure_mode,
            "must be true or false",
        )
        delta_range = "must be a finite number in (0, 1)"
        delta = check_finite("privacy.target_delta", self.target_delta, delta_range)
        check(0 < delta < 1, "privacy.target_delta", self.target_delta, delta_range)
        set_(self, "target_delta", delta)
        check(
            self.conversion is Conversion.DEFAULT or self.accountant is Accountant.RDP,
            "privacy.conversion",
            self.conversion.value,
            "needs privacy.accountant=rdp (Mironov's conversion is an RDP conversion)",
        )

    # ---- how events are accounted --------------------------------------------------------
    @property
    def neighboring_relation(self) -> NeighboringRelation:
        """The relation the events are stated for (add/remove unless the family says)."""
        return NeighboringRelation.ADD_REMOVE

    @property
    def accounting(self) -> AccountingSpec:
        """Accountant, conversion, δ and relation: what the run's ledger is built from."""
        return AccountingSpec(
            accountant=self.accountant,
            conversion=self.conversion,
            target_delta=self.target_delta,
            neighboring_relation=self.neighboring_relation,
        )

    @property
    def noise_source(self) -> NoiseSource:
        """``secure`` (OS entropy) or ``seeded`` (reproducible from the run's seed)."""
        return NoiseSource.SECURE if self.secure_mode else NoiseSource.SEEDED

    @property
    def non_private(self) -> bool:
        """True when the release carries no noise at all (e.g. ``noise_multiplier=0``)."""
        return False

    @property
    def needs_calibration(self) -> bool:
        """Whether the run must call :meth:`calibrated` (a ``target_epsilon`` was given)."""
        return self.target_epsilon is not None

    def noise_or_target(self, noise: float | None) -> float | None:
        """``noise`` (the family's :attr:`calibrates` parameter) checked against
        ``target_epsilon``: exactly one of them is given; ``noise`` must be a finite number
        >= 0.

        Raises
        ------
        ConfigError
            Naming ``privacy.<noise parameter>``.
        """
        name, target = f"privacy.{self.calibrates}", self.target_epsilon
        if noise is None:
            check(target is not None, name, None, "and privacy.target_epsilon=None: give one")
            return None
        check(
            target is None,
            name,
            noise,
            f"and privacy.target_epsilon={target!r}: give exactly one (set {name}=null to "
            "calibrate to privacy.target_epsilon)",
        )
        value = check_finite(name, noise, "must be a finite number >= 0")
        check(value >= 0, name, noise, "must be >= 0")
        return value

    def with_noise(self, noise: float, target_epsilon: float | None = None) -> Self:
        """A copy whose noise parameter is ``noise`` (no pending target; the target it was
        calibrated to, if any, recorded)."""
        changes: dict[str, Any] = {self.calibrates: noise, "target_epsilon": None}
        if target_epsilon is not None:
            changes["calibrated_from_target_epsilon"] = target_epsilon
        return dataclasses.replace(self, **changes)

    # ---- events --------------------------------------------------------------------------
    @abstractmethod
    def round_events(self) -> EventRuns:
        """Events of one round's aggregated release, every noise share in the sum."""

    def local_events(self) -> EventRuns:
        """Events of one round for a single client's own release (its LDP); default none."""
        return []

    def degraded_round_events(self, contributors: int) -> EventRuns:
        """Events of a round whose sum holds only ``contributors`` clients' noise.

        Raises
        ------
        UnaccountableRound
            When the family cannot account it (default): the run fails that round.
        """
        raise UnaccountableRound(
            f"{type(self).__name__} cannot account a round with {contributors} clients"
        )

    def prefix_events(self, previous_round: int, server_round: int) -> EventRuns:
        """Events that releasing ``server_round`` adds when the last charged round was
        ``previous_round`` (used when :attr:`prefix_accounted`; default: one round's)."""
        return self.round_events()

    def startup_check(self) -> dict[str, float]:
        """Checks of the mechanism the run makes once before training (e.g. the correlated
        noise's materialised sensitivity); their figures for ``results.json``. Default none.

        Raises
        ------
        ConfigError
            When the mechanism the run would draw is not the one its events account.
        """
        return {}

    def enforced_participation(self) -> Participation | None:
        """The participation pattern the server must enforce for these events to hold
        (:mod:`fedpriv.mechanisms.enforced_cohort`); ``None`` (default): any cohort."""
        return None

    def accounting_epoch(self, server_round: int) -> int | None:
        """The epoch whose events cover ``server_round`` (recorded once, at its first released
        round: random allocation); ``None`` (default): every round is its own event."""
        return None

    def partial_epoch_events(self, server_round: int) -> EventRuns | None:
        """The events of ``server_round``'s epoch when it is the last round released so far
        and its epoch is not complete (random allocation, k = 1: a truncated epoch); ``None``
        (default): the epoch's whole events are charged at its first round."""
        return None

    def epsilon(self, num_rounds: int) -> float:
        """ε at ``target_delta`` after ``num_rounds`` full rounds, composed as the run's ledger
        composes them."""
        return self.accounting.epsilon_after(self.round_events(), num_rounds)

    # ---- calibration, binding, reporting -------------------------------------------------
    def calibrated(self, target_epsilon: float, num_rounds: int) -> Self:
        """A NEW spec whose noise parameter (:attr:`calibrates`) meets ``target_epsilon`` after
        ``num_rounds`` rounds (``target_epsilon=None`` and ``calibrated_from_target_epsilon``
        set in it). Written once for every family, which only describes its search
        (:meth:`noise_search`) and, when its mechanism depends on the horizon, binds it
        (:meth:`calibration_spec`).

        The noise is bisected (:func:`~fedpriv.accounting.core.calibrate.bisect_noise`) on
        :meth:`epsilon` itself, i.e. on the run's own events, accountant and conversion, never
        on a closed form that could overshoot: the returned value was accounted and meets the
        target; the next value toward less privacy (``rtol`` of the search away, 0.1 % by
        default) was accounted and does not.

        Raises
        ------
        ConfigError
            ``privacy.target_epsilon`` when it is not a finite number > 0 or no value of the
            noise parameter in the search range reaches it; ``num_rounds`` when it is not an
            integer >= 1.
        """
        target = check_positive("privacy.target_epsilon", target_epsilon)
        check(
            isinstance(num_rounds, (int, np.integer))
            and not isinstance(num_rounds, bool)
            and num_rounds >= 1,
            "num_rounds",
            num_rounds,
            "must be an integer >= 1",
        )
        rounds = int(num_rounds)
        spec = self.calibration_spec(rounds)
        search = spec.noise_search(target, rounds)
        value = spec.solve_noise(target, lambda s: s.epsilon(rounds), search)
        return spec.with_noise(value, target)

    def calibration_spec(self, num_rounds: int) -> Self:
        """The spec :meth:`calibrated` searches and returns for ``num_rounds`` rounds; default
        ``self`` (a mechanism built for its horizon binds ``num_rounds`` here)."""
        return self

    def noise_search(self, target_epsilon: float, num_rounds: int) -> NoiseSearch:
        """How :meth:`calibrated` searches the noise parameter for ``target_epsilon`` after
        ``num_rounds`` rounds: its range, a bracket from a faster accountant, the tolerance, a
        parameter that ε increases with. Default: the smallest value in [1e-6, 1e6] to 0.1 %.
        """
        return NoiseSearch()

    def solve_noise(
        self,
        target_epsilon: float,
        epsilon_of: Callable[[Self], float],
        search: NoiseSearch | None = None,
    ) -> float:
        """The value of the noise parameter that ``search`` (default :class:`NoiseSearch`)
        finds for ``epsilon_of(self.with_noise(value)) <= target_epsilon``: the one bisection
        behind :meth:`calibrated`, its brackets and other accounted quantities (a group's ε).

        Raises
        ------
        ConfigError
            As :meth:`NoiseSearch.solve <fedpriv.accounting.core.calibrate.NoiseSearch.solve>`.
        """
        search = NoiseSearch() if search is None else search
        return search.solve(
            lambda v: epsilon_of(self.with_noise(v)), target_epsilon, f"privacy.{self.calibrates}"
        )

    def bound(self, **facts: Any) -> Self:
        """A copy with the run's facts set (only :attr:`bound_fields`), validated again.

        Raises
        ------
        TypeError
            For a field that is not bound by the run (a config key must come from the config).
        """
        wrong = sorted(set(facts) - set(self.bound_fields))
        if wrong:
            raise TypeError(f"{type(self).__name__}.bound: {wrong} are not bound fields")
        return dataclasses.replace(self, **facts)

    def report(self, rounds: int) -> dict[str, float]:
        """Extra per-round figures to print and save after ``rounds`` released rounds (e.g. ε
        for groups of records); default none."""
        return {}

    def summary(self) -> dict[str, Any]:
        """The spec for ``results.json``'s ``privacy`` block: the family, every field (enums
        as their values), and :meth:`extra_summary`."""
        fields = {f.name: _summary_value(getattr(self, f.name)) for f in dataclasses.fields(self)}
        return {"family": self.family, **fields, **self.extra_summary()}

    def extra_summary(self) -> dict[str, Any]:
        """Derived figures for the summary (e.g. each client's noise share); default none."""
        return {}

    # ---- fedpriv-account ------------------------------------------------------------------
    def lower_bound(self, num_rounds: int) -> LowerBound:
        """A lower bound on :meth:`epsilon` after ``num_rounds`` rounds, at ``target_delta``:
        the optimistic PLD of a pair of datasets that the mechanism's outputs realise
        (:mod:`fedpriv.accounting.core.lower_bound`). Default: none, with the reason."""
        return LowerBound.not_available("no realised pair of this mechanism is computed")


def calibrated_value(name: str, value: float | None) -> float:
    """A family's noise parameter ``privacy.<name>`` as a number.

    Raises
    ------
    ConfigError
        Before calibration (``None``: the run calls ``calibrated`` first).
    """
    check(
        value is not None,
        f"privacy.{name}",
        None,
        "is not calibrated yet (the run calls calibrated(target_epsilon, num_rounds))",
    )
    return float(value)  # type: ignore[arg-type]


def config_schema(spec_cls: type[PrivacySpec]) -> type:
    """The Hydra structured config of ``spec_cls``: its fields that are not bound by the run,
    with their types (enums as strings) and defaults, and ``_target_`` naming the class.

    The spec's defaults are the only defaults: ``conf/privacy/<family>.yaml`` states none.
    """
    return dataclass_schema(spec_cls, skip=spec_cls.bound_fields)


def _summary_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _summary_value(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return plain(value)
