"""The privacy ledger of a run: ordered ``(event, count)`` runs from which ε is recomputed.

A ledger holds what happened (events, :mod:`fedpriv.accounting.core.event`) apart from how it
is accounted (an accountant, :mod:`fedpriv.accounting.core.accountant`), as dp-accounting
does. It only records runs, checks that they compose, restores them from JSON, and asks the
accountant chosen for ε or δ. Consecutive equal events merge into one run, so a training loop
that records one event per step keeps a handful of runs, and ε is computed by composing each
run *with its count* (dp-accounting is ~1000x faster that way than per step).

Composition rules (checked in :meth:`PrivacyLedger.record`, before anything is stored):

1. only dp-accounting events: PLD (default) or RDP accountant;
2. dp-accounting events with RDP-composable fedpriv events: ``accountant="rdp"`` only, over
   integer orders; the RDP curves add up;
3. a fedpriv event with ``pld()`` (``composes_by_pld = True``: one occurrence's dominating
   dp-accounting PLD, e.g. random allocation) is the ledger's only run, self-composed by PLD
   (``accountant="pld"`` only); events whose class sets ``composes_with_own_kind`` (e.g.
   fixed-size cohorts at several noise levels, whole and partial allocation epochs) compose
   with others of their class, on the coarser loss grid
   (:mod:`fedpriv.accounting.accountants.pld_grid`);
4. any other event without ``rdp`` (``composes_by_rdp = False``) must be the ledger's only
   run; its ``epsilon``/``delta`` answer directly. Recording anything else next to it raises
   :class:`IncompatibleEventsError`, since no theorem here composes the two.

The accountant that answers (:meth:`PrivacyLedger.analysis` names it):

* a lone event of rule 4: its own analysis
  (:class:`~fedpriv.accounting.core.accountant.OwnAnalysis`);
* ``accountant="pld"`` and every run a Gaussian release without sampling: exact μ-GDP
  (:class:`~fedpriv.accounting.accountants.gdp.ExactGaussianAccountant`);
* otherwise the one the ``accountant`` setting names
  (:data:`~fedpriv.accounting.accountants.registry.BUDGET_ACCOUNTANTS`):
  :class:`~fedpriv.accounting.accountants.pld.PldAccountant` (ε is ``min(PLD ε, RDP ε)``:
  both are valid upper bounds, and PLD alone returns ``inf`` at extreme δ (1e-18) because of
  its truncated tail mass) or :class:`~fedpriv.accounting.accountants.rdp.RdpAccountant`.

Only accountants whose answer is an upper bound are ever chosen; the Monte Carlo estimate is
not one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from dp_accounting import dp_event

from fedpriv.accounting.accountants.gdp import ExactGaussianAccountant
from fedpriv.accounting.accountants.pld import PldAccountant
from fedpriv.accounting.accountants.registry import BUDGET_ACCOUNTANTS
from fedpriv.accounting.core.accountant import (
    RELATIONS,
    AccountingSettings,
    EventAccountant,
    OwnAnalysis,
)
from fedpriv.accounting.core.event import FedprivEvent, event_from_dict, event_to_dict
from fedpriv.accounting.core.vocabulary import ACCOUNTANTS, CONVERSIONS, Accountant
from fedpriv.common.errors import ConfigError, check

Run = tuple[Any, int]


class IncompatibleEventsError(NotImplementedError):
    """Two events (or an event and an accountant) that no implemented theorem composes."""


class PrivacyLedger:
    """Ordered ``(event, count)`` runs of one training run; ε is a function of them.

    Parameters
    ----------
    accountant : {"pld", "rdp"}
        PLD (dp-accounting, discretization ``pld_discretization``; ε reported as the minimum
        with the RDP bound) or RDP.
    conversion : {"default", "mironov"}
        RDP → (ε, δ) conversion; ``"mironov"`` needs ``accountant="rdp"``.
    neighboring_relation : {"add_remove", "replace_one"}
        The neighbouring relation every event is accounted under.
    pld_discretization : float, optional
        PLD value discretization interval (connect-the-dots, pessimistic, so ε stays an upper
        bound). ``None`` (default) picks it from the ledger: 1e-4 (dp-accounting's default)
        while the RDP ε at δ = 1e-5 is ≤ 5, growing in proportion to that ε up to 1e-3
        beyond, which keeps the cost flat (10 runs of 1e5 steps at ε ≈ 150: 13 s → 1.4 s)
        at a relative precision of about 1e-3 of ε.

    Raises
    ------
    ConfigError
        For an unknown accountant, conversion or relation, or mironov with PLD.
    """

    def __init__(
        self,
        accountant: str = "pld",
        conversion: str = "default",
        neighboring_relation: str = "add_remove",
        pld_discretization: float | None = None,
    ) -> None:
        check(accountant in ACCOUNTANTS, "accountant", accountant, "must be one of: pld, rdp")
        check(
            conversion in CONVERSIONS, "conversion", conversion, "must be one of: default, mironov"
        )
        check(
            not (conversion == "mironov" and accountant != "rdp"),
            "conversion",
            conversion,
            "requires accountant='rdp'",
        )
        check(
            neighboring_relation in RELATIONS,
            "neighboring_relation",
            neighboring_relation,
            "must be one of: " + ", ".join(RELATIONS),
        )
        check(
            pld_discretization is None or 0 < pld_discretization <= 0.1,
            "pld_discretization",
            pld_discretization,
            "must be in (0, 0.1] or None (automatic)",
        )
        self.accountant = accountant
        self.conversion = conversion
        self.neighboring_relation = neighboring_relation
        self.pld_discretization = None if pld_discretization is None else float(pld_discretization)
        self._settings = AccountingSettings(
            self.conversion, self.neighboring_relation, self.pld_discretization
        )
        self._budget = BUDGET_ACCOUNTANTS[Accountant(accountant)](self._settings)
        self._exact = ExactGaussianAccountant(self._settings)
        self._own = OwnAnalysis(self._settings)
        self._runs: tuple[Run, ...] = ()
        self._answers: EventAccountant | None = None

    # ------------------------------------------------------------------ recording
    @property
    def runs(self) -> tuple[Run, ...]:
        """The ``(event, count)`` runs in recording order."""
        return self._runs

    @property
    def steps(self) -> int:
        """Total number of recorded events (sum of counts)."""
        return sum(c for _, c in self._runs)

    def record(self, event: Any, count: int = 1) -> None:
        """Append ``count`` occurrences of ``event``; merge with the last run if equal.

        Raises
        ------
        ConfigError
            If ``count`` is not an integer >= 1 or the event is not an event.
        IncompatibleEventsError
            If the event cannot be accounted together with the recorded ones under this
            ledger's accountant and relation (nothing is recorded then).
        """
        check(
            isinstance(count, (int, np.integer)) and not isinstance(count, bool) and count >= 1,
            "count",
            count,
            "must be an integer >= 1",
        )
        count = int(count)
        if self._runs and self._runs[-1][0] == event:
            new_runs = self._runs[:-1] + ((event, self._runs[-1][1] + count),)
        else:
            new_runs = self._runs + ((event, count),)
        answers = self._choose(new_runs)  # raises before anything changes
        self._runs, self._answers = new_runs, answers

    def _choose(self, runs: Sequence[Run]) -> EventAccountant | None:
        """Check that ``runs`` compose under this ledger's settings and return the accountant
        that answers for them (module docstring); ``None`` for no runs."""
        if not runs:
            return None
        own = self._own_events(runs)
        if any(e.composes_by_pld for e in own):
            self._check_own_kind(runs)
        elif any(not e.composes_by_rdp for e in own):
            self._check_alone(runs, next(e for e in own if not e.composes_by_rdp))
            return self._own
        refusal = self._budget.refusal(runs)
        if refusal is not None:
            raise IncompatibleEventsError(refusal)
        if self.accountant == Accountant.PLD and self._exact.refusal(runs) is None:
            return self._exact
        return self._budget

    def _own_events(self, runs: Sequence[Run]) -> list[FedprivEvent]:
        """The fedpriv events of ``runs``, each checked to hold under the ledger's relation.

        Raises
        ------
        ConfigError
            For anything that is neither a dp-accounting event nor a fedpriv event.
        """
        for e, _ in runs:
            if not isinstance(e, (FedprivEvent, dp_event.DpEvent)):
                raise ConfigError("event", e, "must be a dp_accounting DpEvent or a FedprivEvent")
        own = [e for e, _ in runs if isinstance(e, FedprivEvent)]
        for e in own:
            if self.neighboring_relation not in e.supported_relations:
                raise IncompatibleEventsError(
                    f"{type(e).__name__} holds only for neighboring_relation in "
                    f"{sorted(e.supported_relations)}, not {self.neighboring_relation!r}"
                )
        return own

    @staticmethod
    def _check_own_kind(runs: Sequence[Run]) -> None:
        """PLD-composable fedpriv events compose only with others of their class, and only if
        the class sets ``composes_with_own_kind``; any other must be the ledger's only run."""
        first = type(next(e for e, _ in runs if isinstance(e, FedprivEvent) and e.composes_by_pld))
        own_kind = first.composes_with_own_kind and all(type(e) is first for e, _ in runs)
        if len(runs) > 1 and not own_kind:
            names = ", ".join(sorted({type(e).__name__ for e, _ in runs}))
            raise IncompatibleEventsError(
                f"{first.__name__} composes only with itself (ledger would hold: "
                f"{names}); keep it in a ledger of its own"
            )

    @staticmethod
    def _check_alone(runs: Sequence[Run], standalone: FedprivEvent) -> None:
        """An event that knows only its own (ε, δ) must be the ledger's only run."""
        if len(runs) > 1:
            others = ", ".join(sorted({type(e).__name__ for e, _ in runs}))
            raise IncompatibleEventsError(
                f"{type(standalone).__name__} knows only its own (epsilon, delta) "
                f"and cannot be composed with other events (ledger would hold: {others}); "
                "keep it in a ledger of its own"
            )

    # ------------------------------------------------------------------ accounting
    @property
    def pld_interval(self) -> float:
        """The PLD discretization interval used for the recorded runs
        (:meth:`~fedpriv.accounting.accountants.pld.PldAccountant.interval`)."""
        pld = self._budget if isinstance(self._budget, PldAccountant) else None
        return (pld or PldAccountant(self._settings)).interval(self._runs)

    def analysis(self) -> str:
        """What answers for ε now: ``"pld"``, ``"rdp (CONVERSION)"``, ``"gaussian (exact)"``,
        or, for an event that stands alone, ``"NAME (own analysis)"`` (the accountant and
        conversion settings are then unused); ``"none"`` for an empty ledger."""
        if self._answers is None:
            return "none"
        return self._answers.analysis(self._runs)

    def get_epsilon(self, target_delta: float) -> float:
        """ε of everything recorded, at ``target_delta`` (0 for an empty ledger).

        Raises
        ------
        ConfigError
            If ``target_delta`` is not in (0, 1).
        """
        check(0 < target_delta < 1, "target_delta", target_delta, "must be in (0, 1)")
        if self._answers is None:
            return 0.0
        return _checked(float(self._answers.epsilon(self._runs, target_delta)), "epsilon")

    def get_delta(self, target_epsilon: float) -> float:
        """δ of everything recorded, at ``target_epsilon`` (0 for an empty ledger).

        Raises
        ------
        ConfigError
            If ``target_epsilon`` is negative or NaN.
        """
        check(target_epsilon >= 0, "target_epsilon", target_epsilon, "must be >= 0")
        if self._answers is None:
            return 0.0
        return _checked(float(self._answers.delta(self._runs, target_epsilon)), "delta")

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """JSON-able form; :meth:`from_dict` rebuilds a ledger with identical ε."""
        return {
            "format": "fedpriv-ledger/1",
            "accountant": self.accountant,
            "conversion": self.conversion,
            "neighboring_relation": self.neighboring_relation,
            "pld_discretization": self.pld_discretization,
            "runs": [{"event": event_to_dict(e), "count": c} for e, c in self._runs],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PrivacyLedger:
        """Inverse of :meth:`to_dict`.

        Raises
        ------
        ConfigError
            If the dict is not a fedpriv ledger or names an unknown event type.
        """
        check(
            d.get("format") == "fedpriv-ledger/1",
            "format",
            d.get("format"),
            "must be 'fedpriv-ledger/1'",
        )
        ledger = cls(
            accountant=d["accountant"],
            conversion=d["conversion"],
            neighboring_relation=d["neighboring_relation"],
            pld_discretization=d.get("pld_discretization"),
        )
        for run in d["runs"]:
            ledger.record(event_from_dict(run["event"]), int(run["count"]))
        return ledger

    def __repr__(self) -> str:
        runs = ", ".join(f"({e!r}, {c})" for e, c in self._runs)
        return (
            f"PrivacyLedger(accountant={self.accountant!r}, conversion={self.conversion!r}, "
            f"runs=[{runs}])"
        )


def _checked(x: float, what: str) -> float:
    """Refuse to return NaN: a NaN ε/δ would silently pass any budget check."""
    if math.isnan(x):
        raise FloatingPointError(f"{what} computed as NaN; refusing to report it")
    return x
