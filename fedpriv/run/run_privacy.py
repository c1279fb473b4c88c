"""A run's privacy bookkeeping: the ledgers that the client algorithm's events feed.

The central ledger holds the events of each aggregated release (what the server and the
world see); the local ledger holds one client's own release (its LDP guarantee). Only the
client algorithm's declared events enter them, once per successful round.
"""

from __future__ import annotations

import math
from typing import Any

from fedpriv.accounting.ledger import PrivacyLedger
from fedpriv.accounting.spec import AccountingSpec, NeighboringRelation, parse_enum


class RunPrivacy:
    """Central and local ledgers of a run, fed once per successful server round.

    Parameters
    ----------
    algorithm : ClientAlgorithm
        Supplies ``round_events()`` and ``local_events()``.
    privacy : dict
        The run's ``privacy`` group (accountant, conversion, target_delta, stop_at_epsilon);
        the first three become :attr:`spec`, an :class:`AccountingSpec` (enums, validated).

    Raises
    ------
    ConfigError
        For an accountant, conversion or δ the :class:`AccountingSpec` refuses.
    """

    def __init__(self, algorithm: Any, privacy: dict[str, Any]) -> None:
        self.algorithm = algorithm
        relation = parse_enum(
            NeighboringRelation,
            "neighboring_relation",
            getattr(algorithm, "neighboring_relation", NeighboringRelation.ADD_REMOVE),
        )
        self.spec = AccountingSpec.from_privacy(privacy, neighboring_relation=relation)
        self.target_delta = float(self.spec.target_delta)
        self.stop_at_epsilon = privacy.get("stop_at_epsilon")
        self._privacy = {
            "accountant": self.spec.accountant.value,
            "conversion": self.spec.conversion.value,
            "target_delta": self.target_delta,
        }
        self.central: PrivacyLedger = self.spec.ledger()
        self.local: PrivacyLedger | None = self.spec.ledger() if algorithm.local_events() else None
        self.rounds = 0
        self.epochs: set[int] = set()  # accounting epochs already recorded (whole-epoch events)
        self.analysis = (
            ""  # what answers for the central ε (PrivacyLedger.analysis), set by check()
        )

    def record_round(self, contributors: int | None = None, server_round: int = 0) -> None:
        """Compose one round's events into both ledgers.

        ``contributors`` < ``num_clients`` (dropouts) composes the algorithm's weaker
        ``degraded_round_events`` instead. A round whose accounting epoch
        (``algorithm.accounting_epoch``) is already recorded adds nothing centrally: the
        epoch's events cover all of its rounds.
        """
        epoch = self._epoch(server_round)
        if epoch is None or epoch not in self.epochs:
            for event, count in self.round_events(contributors):
                self.central.record(event, count)
        if epoch is not None:
            self.epochs.add(epoch)
        if self.local is not None:
            for event, count in self.algorithm.local_events():
                self.local.record(event, count)
        self.rounds += 1

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (JSON): both ledgers, the rounds counted, the epochs."""
        return {
            "central": self.central.to_dict(),
            "local": None if self.local is None else self.local.to_dict(),
            "rounds": self.rounds,
            "epochs": sorted(self.epochs),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (ε is then identical to the saved run's)."""
        self.central = PrivacyLedger.from_dict(state["central"])
        local = state.get("local")
        self.local = None if local is None else PrivacyLedger.from_dict(local)
        self.rounds = int(state["rounds"])
        self.epochs = {int(e) for e in state.get("epochs", [])}

    def _epoch(self, server_round: int) -> int | None:
        epoch_of = getattr(self.algorithm, "accounting_epoch", None)
        return epoch_of(server_round) if server_round and epoch_of is not None else None

    def round_events(self, contributors: int | None = None) -> list[tuple[Any, int]]:
        """The events of a round whose sum holds ``contributors`` clients' noise (``None``: all
        the algorithm's noise shares); fewer: the algorithm's ``degraded_round_events``."""
        if contributors is None or contributors >= self.algorithm.num_clients:
            return self.algorithm.round_events()
        return self.algorithm.degraded_round_events(contributors)

    def check(self) -> RunPrivacy:
        """Compose one round into scratch ledgers, so an accountant that cannot account the
        algorithm's events is refused before training (ConfigError naming the field); sets
        :attr:`analysis` and returns ``self``."""
        from fedpriv.accounting.ledger import IncompatibleEventsError
        from fedpriv.common.errors import ConfigError

        trial = RunPrivacy(self.algorithm, self._privacy)
        try:
            trial.record_round()
            trial.epsilon()
        except IncompatibleEventsError as exc:
            raise ConfigError(
                "privacy.accountant",
                self.spec.accountant.value,
                f"cannot account this client algorithm: {exc}",
            ) from None
        self.analysis = trial.central.analysis()
        return self

    def epsilon(self) -> float:
        """Central ε at ``target_delta`` (0 before any release)."""
        return self.central.get_epsilon(self.target_delta) if self.rounds else 0.0

    def local_epsilon(self) -> float | None:
        """One client's own ε at ``target_delta`` (its noise alone), or ``None`` if not defined."""
        if self.local is None:
            return None
        return self.local.get_epsilon(self.target_delta) if self.rounds else 0.0

    def next_round_exceeds_budget(
        self, contributors: int | None = None, server_round: int = 0
    ) -> bool:
        """Whether composing one more round (of ``contributors`` clients' noise, ``None``: all
        noise shares) would push ε above ``stop_at_epsilon`` (a round of an epoch already
        recorded adds nothing)."""
        if self.stop_at_epsilon is None:
            return False
        epoch = self._epoch(server_round)
        if epoch is not None and epoch in self.epochs:
            return False
        trial = PrivacyLedger.from_dict(self.central.to_dict())
        for event, count in self.round_events(contributors):
            trial.record(event, count)
        eps = trial.get_epsilon(self.target_delta)
        return not math.isfinite(eps) or eps > float(self.stop_at_epsilon)
