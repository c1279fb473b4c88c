"""How a run's events are accounted: the accountant, the RDP conversion and δ.

:class:`AccountingSpec` is the part of every privacy spec that says HOW events are accounted;
a family's spec (:mod:`fedpriv.accounting.core.privacy_spec`) says WHAT is released and builds the
events. Runs and ``fedpriv-account`` build the same specs, so the CLI answers exactly what a run
does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedpriv.accounting.core.ledger import PrivacyLedger
from fedpriv.accounting.core.vocabulary import Accountant, Conversion, NeighboringRelation
from fedpriv.common.errors import check
from fedpriv.common.validate import check_finite, parse_enum


@dataclass(frozen=True, kw_only=True)
class AccountingSpec:
    """How a run's (or a CLI call's) events are accounted.

    Parameters
    ----------
    accountant : Accountant
        PLD (default, tight) or RDP.
    conversion : Conversion
        RDP → (ε, δ) conversion; ``mironov`` needs ``accountant=rdp``.
    target_delta : float
        δ at which ε is reported, in (0, 1).
    neighboring_relation : NeighboringRelation
        Set by the mechanism (add/remove for Poisson sampling, replace-one for fixed-size
        sampling without replacement).

    Raises
    ------
    ConfigError
        For a value outside its set or range (``privacy.<field>`` named).
    """

    accountant: Accountant = Accountant.PLD
    conversion: Conversion = Conversion.DEFAULT
    target_delta: float = 1e-5
    neighboring_relation: NeighboringRelation = NeighboringRelation.ADD_REMOVE

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "accountant", parse_enum(Accountant, "privacy.accountant", self.accountant))
        set_(self, "conversion", parse_enum(Conversion, "privacy.conversion", self.conversion))
        set_(
            self,
            "neighboring_relation",
            parse_enum(NeighboringRelation, "neighboring_relation", self.neighboring_relation),
        )
        delta = check_finite("privacy.target_delta", self.target_delta, "must be in (0, 1)")
        check(0 < delta < 1, "privacy.target_delta", self.target_delta, "must be in (0, 1)")
        check(
            self.conversion is Conversion.DEFAULT or self.accountant is Accountant.RDP,
            "privacy.conversion",
            self.conversion.value,
            "needs privacy.accountant=rdp (Mironov's conversion is an RDP conversion)",
        )

    def ledger(self) -> PrivacyLedger:
        """An empty :class:`~fedpriv.accounting.core.ledger.PrivacyLedger` with these settings."""
        return PrivacyLedger(
            accountant=self.accountant.value,
            conversion=self.conversion.value,
            neighboring_relation=self.neighboring_relation.value,
        )

    def epsilon_after(self, round_events: list[tuple[Any, int]], num_rounds: int) -> float:
        """ε at :attr:`target_delta` after ``num_rounds`` rounds of ``round_events`` (0 for none).

        Raises
        ------
        ConfigError
            If ``num_rounds`` is not an integer >= 0.
        """
        check(
            isinstance(num_rounds, int) and num_rounds >= 0,
            "num_rounds",
            num_rounds,
            "must be an integer >= 0",
        )
        if num_rounds == 0:
            return 0.0
        return self.epsilon([(event, count * num_rounds) for event, count in round_events])

    def epsilon(self, events: list[tuple[Any, int]]) -> float:
        """ε at :attr:`target_delta` of ``events`` (``[(event, count), ...]``) composed."""
        ledger = self.ledger()
        for event, count in events:
            ledger.record(event, count)
        return float(ledger.get_epsilon(self.target_delta))
