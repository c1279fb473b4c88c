"""The accountant protocol: how a sequence of ``(event, count)`` runs becomes (ε, δ).

What happened (events, :mod:`fedpriv.accounting.core.event`) is kept apart from how it is
accounted, as in dp-accounting (``privacy_accountant.py``). A ledger
(:mod:`fedpriv.accounting.core.ledger`) records runs; an :class:`EventAccountant` answers for
them. Every accountant states the theorem behind its answer in its docstring and declares in
``upper_bound`` whether that answer is a bound: only bounds answer a budget, a calibration or a
report's ε. The implementations, one module each, are listed in
:mod:`fedpriv.accounting.accountants.registry`:

* :class:`~fedpriv.accounting.accountants.pld.PldAccountant`: privacy loss distributions
  (dp-accounting's, and fedpriv events' own dominating PLDs on common grids), reported as
  ``min(PLD ε, RDP ε)``;
* :class:`~fedpriv.accounting.accountants.rdp.RdpAccountant`: Rényi DP curves added up and
  converted at the best order;
* :class:`~fedpriv.accounting.accountants.gdp.ExactGaussianAccountant`: Gaussian releases
  without sampling, exactly (μ-GDP);
* :class:`OwnAnalysis` (here): an event that knows only its own (ε, δ), alone in its ledger;
* :class:`~fedpriv.accounting.accountants.monte_carlo.MonteCarloEstimate`: an ESTIMATE
  (``upper_bound = False``) printed beside a budget, never one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation

#: ``(event, count)`` runs in recording order, as a ledger holds them.
Runs = Sequence[tuple[Any, int]]
#: The neighbouring relations (their spelling) and dp-accounting's names for them.
RELATIONS = {
    "add_remove": NeighboringRelation.ADD_OR_REMOVE_ONE,
    "replace_one": NeighboringRelation.REPLACE_ONE,
}

_T = TypeVar("_T")


@dataclass(frozen=True)
class AccountingSettings:
    """What an accountant needs besides the runs (the ledger validates every field).

    Parameters
    ----------
    conversion : {"default", "mironov"}
        RDP → (ε, δ) conversion.
    neighboring_relation : {"add_remove", "replace_one"}
        The relation every event is accounted under.
    pld_discretization : float, optional
        PLD loss grid; ``None`` picks it from the runs.
    """

    conversion: str = "default"
    neighboring_relation: str = "add_remove"
    pld_discretization: float | None = None


class EventAccountant(Protocol):
    """The one interface of every accountant.

    ``upper_bound``
        ``True`` when :meth:`epsilon` never falls below the true ε of the runs (and
        :meth:`delta` below their true δ); only such accountants answer a ledger.
    ``refusal(runs)``
        ``None`` when the accountant covers ``runs``, else the reason it does not (a sentence
        naming the event and what to do). :meth:`epsilon` and :meth:`delta` may assume
        ``refusal(runs) is None``.
    ``epsilon(runs, target_delta)`` / ``delta(runs, target_epsilon)``
        The composed guarantee of all runs.
    ``analysis(runs)``
        What answers, as a ledger reports it (``"pld"``, ``"rdp (default)"``, ...).
    """

    upper_bound: ClassVar[bool]

    def refusal(self, runs: Runs) -> str | None: ...

    def epsilon(self, runs: Runs, target_delta: float) -> float: ...

    def delta(self, runs: Runs, target_epsilon: float) -> float: ...

    def analysis(self, runs: Runs) -> str: ...


class RunsMemo:
    """Values computed from one ``runs`` object, forgotten as soon as another is passed.

    A ledger passes the same tuple until it records again, then a new one; the memo keeps a
    reference to the runs it holds values for, so comparing identities is sound.
    """

    def __init__(self) -> None:
        self._runs: object = None
        self._values: dict[str, Any] = {}

    def get(self, runs: Runs, key: str, compute: Callable[[], _T]) -> _T:
        """The value under ``key`` for ``runs``, computed once."""
        if runs is not self._runs:
            self._runs, self._values = runs, {}
        if key not in self._values:
            self._values[key] = compute()
        value: _T = self._values[key]
        return value


def own_events(runs: Runs) -> list[Any]:
    """The fedpriv events of ``runs``: every event that is not a dp-accounting ``DpEvent`` (a
    ledger admits nothing else)."""
    return [e for e, _ in runs if not isinstance(e, dp_event.DpEvent)]


def unsupported_dp_event(
    runs: Runs, supports: Callable[[Any], bool], name: str, relation: str
) -> str | None:
    """The refusal for the first dp-accounting event of ``runs`` that ``supports`` (a
    dp-accounting accountant's) rejects, or ``None``."""
    for e, _ in runs:
        if isinstance(e, dp_event.DpEvent) and not supports(e):
            return (
                f"{e} is not supported by the {name} accountant under "
                f"neighboring_relation={relation!r}"
            )
    return None


class OwnAnalysis:
    """An event that knows only its own (ε, δ) after ``count`` occurrences (its class names
    the theorem: e.g. check-in's Theorem 3, batch clipping's f-DP mixture), alone in its
    ledger: no theorem here composes it with anything else, so it answers for itself.

    The accountant and conversion settings are unused.
    """

    upper_bound: ClassVar[bool] = True

    def __init__(self, settings: AccountingSettings | None = None) -> None:
        self.settings = settings or AccountingSettings()

    def refusal(self, runs: Runs) -> str | None:
        """``None`` for one run of a fedpriv event; the reason otherwise."""
        if len(runs) == 1 and own_events(runs):
            return None
        return "an event's own analysis answers only for a ledger holding that event alone"

    def epsilon(self, runs: Runs, target_delta: float) -> float:
        """The event's own ε after its count (no clamping: the event's theorem answers)."""
        event, count = runs[0]
        return float(event.epsilon(target_delta, count))

    def delta(self, runs: Runs, target_epsilon: float) -> float:
        """The event's own δ after its count."""
        event, count = runs[0]
        return float(event.delta(target_epsilon, count))

    def analysis(self, runs: Runs) -> str:
        """``"NAME (own analysis)"``."""
        return f"{type(runs[0][0]).__name__} (own analysis)"
