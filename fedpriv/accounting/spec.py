"""Closed sets of the accounting vocabulary and the typed settings every analysis shares.

Enums rather than strings for every closed set: a value outside the set is refused when the
enum is built (``Accountant("pdl")`` raises), so no code path compares substrings. They are
``StrEnum``: ``Accountant.PLD == "pld"``, so configs, JSON and the CLI keep their spelling.

:class:`AccountingSpec` is the part of a run's ``privacy`` group that says HOW events are
accounted (accountant, conversion, δ); a mechanism family's own frozen spec (e.g.
:class:`fedpriv.accounting.dpsgd.DPSGDSpec`) says WHAT is released and builds the events.
Runs and ``fedpriv-account`` build the same specs, so the CLI answers exactly what a run does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from fedpriv.common.errors import ConfigError, check

E = TypeVar("E", bound=StrEnum)


class Accountant(StrEnum):
    """How composed events become (ε, δ): dp-accounting's PLD (tight) or RDP."""

    PLD = "pld"
    RDP = "rdp"


class Conversion(StrEnum):
    """RDP → (ε, δ) conversion: dp-accounting's (tight) or Mironov 2017 Prop. 3 (the third
    paper's published numbers)."""

    DEFAULT = "default"
    MIRONOV = "mironov"


class NeighboringRelation(StrEnum):
    """Neighbouring datasets: add/remove one unit (record or client), or replace one."""

    ADD_REMOVE = "add_remove"
    REPLACE_ONE = "replace_one"


class NoiseSource(StrEnum):
    """Where a run's noise comes from.

    ``seeded``: reproducible from ``seed``; anyone holding the config can regenerate the noise
    and subtract it (right for a simulation, never for a deployment). ``secure``: OS entropy.
    """

    SEEDED = "seeded"
    SECURE = "secure"


def parse_enum(cls: type[E], field: str, value: Any) -> E:
    """``cls(value)``, or a :class:`ConfigError` naming ``field``, ``value`` and the choices."""
    if isinstance(value, cls):
        return value
    try:
        return cls(value)
    except ValueError:
        choices = ", ".join(m.value for m in cls)
        raise ConfigError(field, value, f"must be one of: {choices}") from None


def check_finite(field: str, value: Any, allowed: str = "must be a finite number") -> float:
    """``float(value)`` when it is a finite number; else :class:`ConfigError` naming the field."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ConfigError(field, value, allowed) from None
    check(math.isfinite(x), field, value, allowed)
    return x


def check_positive(field: str, value: Any, allowed: str = "must be a finite number > 0") -> float:
    """``float(value)`` when it is a finite number > 0; else :class:`ConfigError` (``allowed``)."""
    x = check_finite(field, value, allowed)
    check(x > 0, field, value, allowed)
    return x


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

    @classmethod
    def from_privacy(cls, privacy: dict[str, Any], **overrides: Any) -> AccountingSpec:
        """From a run's ``privacy`` group (missing keys take the defaults)."""
        keys = ("accountant", "conversion", "target_delta")
        kw: dict[str, Any] = {k: privacy[k] for k in keys if k in privacy}
        kw.update(overrides)
        return cls(**kw)

    def ledger(self) -> Any:
        """An empty :class:`~fedpriv.accounting.ledger.PrivacyLedger` with these settings."""
        from fedpriv.accounting.ledger import PrivacyLedger

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
