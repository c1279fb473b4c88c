"""Closed sets of the accounting vocabulary.

Enums rather than strings for every closed set: a value outside the set is refused when the
enum is built (``Accountant("pdl")`` raises), so no code path compares substrings. They are
``StrEnum``: ``Accountant.PLD == "pld"``, so configs, JSON and the CLI keep their spelling.
"""

from __future__ import annotations

from enum import StrEnum


class Accountant(StrEnum):
    """How composed events become (ε, δ): dp-accounting's PLD (tight) or RDP."""

    PLD = "pld"
    RDP = "rdp"


class Conversion(StrEnum):
    """RDP → (ε, δ) conversion: dp-accounting's (tight) or Mironov 2017 Prop. 3 (the third
    paper's published numbers)."""

    DEFAULT = "default"
    MIRONOV = "mironov"


#: The closed sets, as their enums (StrEnum members compare equal to their spelling).
ACCOUNTANTS = tuple(Accountant)
CONVERSIONS = tuple(Conversion)


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
