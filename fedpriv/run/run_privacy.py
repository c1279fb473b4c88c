"""A run's privacy bookkeeping: the ledgers that the privacy spec's events feed.

The central ledger holds the events of each aggregated release (what the server and the
world see); the local ledger holds one client's own release (its LDP guarantee). Only the
run's spec's events enter them, once per released round: the spec that sized the noise.
"""

from __future__ import annotations

import math
from typing import Any

from fedpriv.accounting.core.ledger import IncompatibleEventsError, PrivacyLedger
from fedpriv.accounting.core.privacy_spec import EventRuns, PrivacySpec
from fedpriv.common.errors import ConfigError


class RunPrivacy:
    """Central and local ledgers of a run, fed once per released server round.

    Parameters
    ----------
    spec : PrivacySpec
        The run's bound (and calibrated) spec: its ``round_events``, ``local_events``,
        ``degraded_round_events`` and ``accounting_epoch``.
    nominal_cohort : int
        The clients whose noise a full round's sum holds; a round with fewer contributors is
        accounted with the spec's degraded events.
    """

    def __init__(self, spec: PrivacySpec, nominal_cohort: int) -> None:
        self.spec = spec
        self.nominal_cohort = int(nominal_cohort)
        self.target_delta = float(spec.target_delta)
        self.stop_at_epsilon = spec.stop_at_epsilon
        self.central: PrivacyLedger = spec.accounting.ledger()
        self.local: PrivacyLedger | None = spec.accounting.ledger() if spec.local_events() else None
        self.rounds = 0
        self.epochs: set[int] = set()  # accounting epochs already recorded (whole-epoch events)
        self.last_round = 0  # the last round charged (prefix-accounted specs)
        self.open_epoch: int | None = None  # an epoch charged for its released rounds so far
        self.pending: EventRuns = []  # that epoch's events, not yet in ``central``

    def record_round(self, contributors: int | None = None, server_round: int = 0) -> None:
        """Compose one round's events into both ledgers.

        ``contributors`` below the nominal cohort (dropouts) composes the spec's weaker
        ``degraded_round_events`` instead. A round whose accounting epoch is already recorded
        adds nothing centrally: the epoch's events cover all of its rounds; an epoch the spec
        charges for its released rounds (``partial_epoch_events``) stays :attr:`pending`
        until its last round (or a degraded one) charges it whole.
        """
        epoch = self._epoch(server_round)
        if self.open_epoch is not None and epoch != self.open_epoch:  # it released no more
            self._charge(self.pending)
        if epoch is None or epoch not in self.epochs or epoch == self.open_epoch:
            partial = self._partial(contributors, server_round)
            if partial is None:
                self._charge(self.round_events(contributors, server_round))
            else:
                self.open_epoch, self.pending = epoch, partial
        if epoch is not None:
            self.epochs.add(epoch)
        self.last_round = max(self.last_round, server_round or self.last_round + 1)
        if self.local is not None:
            for event, count in self.spec.local_events():
                self.local.record(event, count)
        self.rounds += 1

    def _charge(self, events: EventRuns) -> None:
        """Record ``events`` centrally; the open epoch (if any) is then charged."""
        for event, count in events:
            self.central.record(event, count)
        self.open_epoch, self.pending = None, []

    def _partial(self, contributors: int | None, server_round: int) -> EventRuns | None:
        """The spec's partial-epoch events of a round whose noise is the nominal one (its
        events are the spec's full ones); ``None`` otherwise."""
        if not server_round:
            return None
        if self.round_events(contributors, server_round) != self.spec.round_events():
            return None
        return self.spec.partial_epoch_events(server_round)

    def ledger(self) -> PrivacyLedger:
        """The central ledger with the open epoch's pending events: what ε is computed from."""
        if not self.pending:
            return self.central
        ledger = PrivacyLedger.from_dict(self.central.to_dict())
        for event, count in self.pending:
            ledger.record(event, count)
        return ledger

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (JSON): both ledgers, the rounds counted, the epochs."""
        return {
            "central": self.central.to_dict(),
            "local": None if self.local is None else self.local.to_dict(),
            "rounds": self.rounds,
            "epochs": sorted(self.epochs),
            "last_round": self.last_round,
            "open_epoch": self.open_epoch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (ε is then identical to the saved run's)."""
        self.central = PrivacyLedger.from_dict(state["central"])
        local = state.get("local")
        self.local = None if local is None else PrivacyLedger.from_dict(local)
        self.rounds = int(state["rounds"])
        self.epochs = {int(e) for e in state.get("epochs", [])}
        self.last_round = int(state.get("last_round", self.rounds))
        self.open_epoch = state.get("open_epoch")
        partial = None if self.open_epoch is None else self._partial(None, self.last_round)
        self.pending = partial or []

    def _epoch(self, server_round: int) -> int | None:
        return self.spec.accounting_epoch(server_round) if server_round else None

    def round_events(self, contributors: int | None = None, server_round: int = 0) -> EventRuns:
        """The events of a round whose sum holds ``contributors`` clients' noise (``None``: the
        nominal cohort); fewer: the spec's ``degraded_round_events``. A prefix-accounted spec
        charges the prefix from the last charged round to ``server_round`` (0: the next)."""
        if self.spec.prefix_accounted:
            return self.spec.prefix_events(self.last_round, server_round or self.last_round + 1)
        if contributors is None or contributors >= self.nominal_cohort:
            return self.spec.round_events()
        return self.spec.degraded_round_events(contributors)

    def check(self) -> str:
        """Compose one round into scratch ledgers, so an accountant that cannot account the
        spec's events is refused before training; returns what answers for the central ε
        (``PrivacyLedger.analysis``).

        Raises
        ------
        ConfigError
            Naming ``privacy.accountant`` when it cannot account the events, or
            ``privacy.<noise>`` when the accountant cannot compute with its value.
        """
        trial = RunPrivacy(self.spec, self.nominal_cohort)
        try:
            trial.record_round()
            trial.epsilon()
        except IncompatibleEventsError as exc:
            raise ConfigError(
                "privacy.accountant",
                self.spec.accountant.value,
                f"cannot account this client algorithm: {exc}",
            ) from None
        except ArithmeticError as exc:  # e.g. sigma=1e300: beyond double precision
            raise ConfigError(
                f"privacy.{self.spec.calibrates}",
                _noise_of(self.spec),
                f"is outside what the accountant can compute ({type(exc).__name__}: {exc}); "
                "use a realistic value",
            ) from None
        return trial.central.analysis()

    def epsilon(self) -> float:
        """Central ε at ``target_delta`` (0 before any release)."""
        return self.ledger().get_epsilon(self.target_delta) if self.rounds else 0.0

    def local_epsilon(self) -> float | None:
        """One client's own ε at ``target_delta`` (its noise alone), or ``None`` if not defined."""
        if self.local is None:
            return None
        return self.local.get_epsilon(self.target_delta) if self.rounds else 0.0

    def next_round_exceeds_budget(
        self, contributors: int | None = None, server_round: int = 0
    ) -> bool:
        """Whether composing one more round (of ``contributors`` clients' noise, ``None``: the
        nominal cohort) would push ε above ``stop_at_epsilon`` (a round of an epoch already
        recorded adds nothing)."""
        if self.stop_at_epsilon is None:
            return False
        epoch = self._epoch(server_round)
        if epoch is not None and epoch in self.epochs and epoch != self.open_epoch:
            return False
        trial = PrivacyLedger.from_dict(self.central.to_dict())
        partial = self._partial(contributors, server_round)
        events = self.round_events(contributors, server_round) if partial is None else partial
        for event, count in events:
            trial.record(event, count)
        eps = trial.get_epsilon(self.target_delta)
        return not math.isfinite(eps) or eps > float(self.stop_at_epsilon)


def _noise_of(spec: PrivacySpec) -> Any:
    """The value of the spec's noise parameter, for a message."""
    return spec.summary().get(spec.calibrates)
