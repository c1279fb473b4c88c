"""Participation patterns of DP-FTRL: how often, and how far apart, one client may take part.

Correlated-noise (matrix-factorization) mechanisms are accounted for a bounded participation
pattern, not for a sampling probability: the server ENFORCES it
(:mod:`fedpriv.mechanisms.enforced_cohort`) and the accountant uses the same object.

- ``single``: each client at most once in the whole run.
- ``min_separation``: at most ``max_participations`` k times, any two at least
  ``min_separation`` b rounds apart (rounds i < j with j - i >= b): after taking part in round
  t a client is excluded from rounds t+1 .. t+b-1.
- ``cyclic_poisson``: clients are split into b fixed groups (a public, seeded partition);
  round t may only sample group (t - 1) mod b, each of its clients independently with
  probability ``client_sample_rate`` q (the amplified BandMF analysis). A client then takes
  part in at most ceil(n / b) rounds, b apart.

References
----------
Choquette-Choo, McMahan, Rush, Thakurta, "Multi-Epoch Matrix Factorization Mechanisms for
Private Machine Learning" (arXiv:2211.06530), Sec. 2 (b-min-separation, k participations);
Choquette-Choo, Ganesh, McKenna, McMahan, Rush, Thakurta, Xu, "(Amplified) Banded Matrix
Factorization: A unified approach to private training" (arXiv:2306.08153), Sec. 4 (cyclic
Poisson sampling, Thm. 4.? amplified BandMF).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from fedpriv.common.errors import check
from fedpriv.common.validate import parse_enum


class ParticipationKind(StrEnum):
    """The closed set of participation patterns an accountant here can account."""

    SINGLE = "single"
    MIN_SEPARATION = "min_separation"
    CYCLIC_POISSON = "cyclic_poisson"


@dataclass(frozen=True, kw_only=True)
class Participation:
    """A bounded participation pattern (see the module docstring).

    Parameters
    ----------
    kind : ParticipationKind
        ``single``, ``min_separation`` or ``cyclic_poisson``.
    max_participations : int, optional
        k >= 1, only with ``min_separation`` (rounds a client may take part in).
    min_separation : int, optional
        b >= 1 rounds between two participations (``min_separation``), or the number of groups
        (``cyclic_poisson``).
    client_sample_rate : float, optional
        q in (0, 1], only with ``cyclic_poisson``: each client of the round's group takes part
        with probability q.

    Raises
    ------
    ConfigError
        For a missing or out-of-range field, or a field given to a kind that does not use it
        (one line naming ``privacy.<field>``).
    """

    kind: ParticipationKind = ParticipationKind.SINGLE
    max_participations: int | None = None
    min_separation: int | None = None
    client_sample_rate: float | None = None

    def __post_init__(self) -> None:
        kind = parse_enum(ParticipationKind, "privacy.participation", self.kind)
        object.__setattr__(self, "kind", kind)
        k, b, q = self.max_participations, self.min_separation, self.client_sample_rate
        uses = {
            ParticipationKind.SINGLE: (),
            ParticipationKind.MIN_SEPARATION: ("max_participations", "min_separation"),
            ParticipationKind.CYCLIC_POISSON: ("min_separation", "client_sample_rate"),
        }[kind]
        for name, value in (
            ("max_participations", k),
            ("min_separation", b),
            ("client_sample_rate", q),
        ):
            field = f"privacy.{name}"
            if name not in uses:
                check(value is None, field, value, f"is not used by participation={kind.value}")
                continue
            check(value is not None, field, value, f"must be set with participation={kind.value}")
            if name == "client_sample_rate":
                ok = isinstance(value, (int, float)) and math.isfinite(value) and 0 < value <= 1
                check(ok, field, value, "must be in (0, 1]")
            else:
                ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
                check(ok, field, value, "must be an integer >= 1")

    @property
    def separation(self) -> int:
        """b: the least number of rounds between two participations of one client (single:
        unbounded, reported as 1 since a client never takes part twice)."""
        return 1 if self.kind is ParticipationKind.SINGLE else int(self.min_separation or 1)

    def max_participations_in(self, num_rounds: int) -> int:
        """The most rounds one client can take part in among ``num_rounds`` rounds: 1,
        ``min(k, ceil(n / b))`` or ``ceil(n / b)``."""
        n = int(num_rounds)
        if self.kind is ParticipationKind.SINGLE:
            return 1 if n >= 1 else 0
        cap = math.ceil(n / self.separation)
        if self.kind is ParticipationKind.MIN_SEPARATION:
            return min(int(self.max_participations or 1), cap)
        return cap

    @property
    def amplified(self) -> bool:
        """Whether the pattern carries a sampling probability the accountant may use (cyclic
        Poisson)."""
        return self.kind is ParticipationKind.CYCLIC_POISSON
