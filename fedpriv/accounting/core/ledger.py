"""The privacy ledger of a run: ordered ``(event, count)`` runs from which ε is recomputed.

A ledger holds what happened (events) apart from how it is accounted (the accountant chosen
when ε is asked for), as dp-accounting does. Consecutive equal events merge into one run, so a
training loop that records one event per step keeps a handful of runs, and ε is computed by
composing each run *with its count* (dp-accounting is ~1000x faster that way than per step).

Events
------
Two kinds of events can be recorded:

* a dp-accounting :class:`~dp_accounting.dp_event.DpEvent` (Gaussian, Poisson-sampled
  Gaussian, ...). These compose with each other under both accountants.
* a fedpriv event: a small frozen dataclass deriving from :class:`FedprivEvent`, for analyses
  dp-accounting lacks (Skellam, f-DP mixtures, random check-ins). The protocol is:

  ``epsilon(target_delta, count=1) -> float`` and ``delta(target_epsilon, count=1) -> float``
      (required) the event's own (ε, δ) guarantee after ``count`` repetitions. Raise
      ``NotImplementedError`` with the reason when ``count`` repetitions are not covered.
  ``rdp(orders) -> np.ndarray`` (optional)
      RDP ε(α) of ONE occurrence at the given integer orders (shape of ``orders``). An event
      class that implements it sets ``composes_by_rdp = True``; it then composes with
      dp-accounting events and other such events under ``accountant="rdp"``.
  ``supported_relations`` (class attribute)
      The neighbouring relations its guarantee holds for (default ``{"add_remove"}``).

  JSON: :meth:`FedprivEvent.to_dict` / :meth:`FedprivEvent.from_dict` use the dataclass
  fields (tuples come back as tuples), so fields must be numbers, strings, bools or tuples of
  them. Override both for anything else.

Composition rules (checked in :meth:`PrivacyLedger.record`, before anything is stored):

1. only dp-accounting events: PLD (default) or RDP accountant of dp-accounting;
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

With the PLD accountant ε is ``min(PLD ε, RDP ε)``: both are valid upper bounds, and PLD
alone returns ``inf`` at extreme δ (1e-18) because of its truncated tail mass.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import math
import sys
from collections.abc import Sequence
from typing import Any, ClassVar

import attr
import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant

from fedpriv.accounting.accountants.gdp import gdp_delta, gdp_epsilon
from fedpriv.accounting.accountants.pld_grid import compose_on_common_grid
from fedpriv.accounting.accountants.rdp import (
    COARSE_ORDERS,
    best_over_orders,
    delta_objective,
    epsilon_objective,
    event_rdp,
)
from fedpriv.accounting.core.vocabulary import Accountant, Conversion
from fedpriv.common.errors import ConfigError, check

#: The closed sets, as their enums (StrEnum members compare equal to their spelling).
ACCOUNTANTS = tuple(Accountant)
CONVERSIONS = tuple(Conversion)
RELATIONS = {
    "add_remove": NeighboringRelation.ADD_OR_REMOVE_ONE,
    "replace_one": NeighboringRelation.REPLACE_ONE,
}
#: Orders of Mironov's original conversion, integers 2..255 (the published numbers of Heikkilä,
#: "On Using Secure Aggregation in Differentially Private Federated Learning with Multiple
#: Local Steps").
MIRONOV_ORDERS = np.arange(2, 256, dtype=float)
#: Integer orders used whenever a fedpriv RDP event is in the ledger.
INTEGER_ORDERS = np.concatenate([np.arange(2, 256), [384, 512, 768, 1024]]).astype(float)
#: PLD grids (value discretization intervals) the automatic choice picks from.
PLD_GRIDS = (1e-4, 2e-4, 5e-4, 1e-3)
#: ε (RDP, at δ = 1e-5) up to which the finest grid is used; above it the grid grows with ε.
PLD_FINE_UP_TO = 5.0
#: Above this RDP ε (at δ = 1e-5) the PLD is skipped: RDP is a valid bound, and the PLD of such
#: a weak mechanism (tiny σ, ~1e8 steps) needs more memory than any machine has.
PLD_MAX_RDP_EPSILON = 1000.0


class IncompatibleEventsError(NotImplementedError):
    """Two events (or an event and an accountant) that no implemented theorem composes."""


class FedprivEvent:
    """Base class of fedpriv's own events (frozen dataclasses). See the module docstring."""

    composes_by_rdp: ClassVar[bool] = False
    composes_by_pld: ClassVar[bool] = False
    composes_with_own_kind: ClassVar[bool] = False
    supported_relations: ClassVar[frozenset[str]] = frozenset({"add_remove"})

    def epsilon(self, target_delta: float, count: int = 1) -> float:
        """ε after ``count`` occurrences at ``target_delta``."""
        raise NotImplementedError

    def delta(self, target_epsilon: float, count: int = 1) -> float:
        """δ after ``count`` occurrences at ``target_epsilon``."""
        raise NotImplementedError

    def pld(self) -> Any:
        """Dominating dp-accounting PLD of one occurrence (only if ``composes_by_pld``)."""
        raise NotImplementedError(f"{type(self).__name__} has no PLD")

    def rdp(self, orders: np.ndarray) -> np.ndarray:
        """RDP ε(α) of one occurrence at ``orders`` (only if ``composes_by_rdp``)."""
        raise NotImplementedError(f"{type(self).__name__} has no RDP curve")

    def to_dict(self) -> dict[str, Any]:
        """The dataclass fields as a JSON-able dict."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FedprivEvent:
        """Inverse of :meth:`to_dict` (lists become tuples)."""
        return cls(**{k: _tuples(v) for k, v in d.items()})


class PldEvent(FedprivEvent):
    """A fedpriv event known by the dominating PLD of one occurrence (subclasses implement
    :meth:`pld`); ``count`` occurrences are its PLD self-composed."""

    composes_by_pld: ClassVar[bool] = True

    def epsilon(self, target_delta: float, count: int = 1) -> float:
        if count == 0:
            return 0.0
        return float(self.pld().self_compose(count).get_epsilon_for_delta(target_delta))

    def delta(self, target_epsilon: float, count: int = 1) -> float:
        if count == 0:
            return 0.0
        return float(self.pld().self_compose(count).get_delta_for_epsilon(target_epsilon))


class IntegerRdpEvent(FedprivEvent):
    """A fedpriv event known by its RDP curve at integer orders (subclasses implement
    :meth:`rdp`); ``count`` occurrences are the curve times ``count``, converted at
    :data:`INTEGER_ORDERS` (:data:`MIRONOV_ORDERS` for Mironov's conversion)."""

    composes_by_rdp: ClassVar[bool] = True

    def epsilon(self, target_delta: float, count: int = 1, conversion: str = "default") -> float:
        """ε of ``count`` occurrences at ``target_delta`` (integer orders)."""
        orders = MIRONOV_ORDERS if conversion == "mironov" else INTEGER_ORDERS
        return max(0.0, rdp_to_epsilon(orders, count * self.rdp(orders), target_delta, conversion))

    def delta(self, target_epsilon: float, count: int = 1, conversion: str = "default") -> float:
        """δ of ``count`` occurrences at ``target_epsilon`` (integer orders)."""
        orders = MIRONOV_ORDERS if conversion == "mironov" else INTEGER_ORDERS
        return rdp_to_delta(orders, count * self.rdp(orders), target_epsilon, conversion)


def rdp_to_epsilon(
    orders: np.ndarray, rdp: np.ndarray, target_delta: float, conversion: str
) -> float:
    """Convert an RDP curve to ε at ``target_delta``.

    ``conversion="default"``: dp-accounting's ``compute_epsilon`` (Canonne, Kamath, Steinke
    2020, Prop. 12 / Asoodeh et al. 2020, with the KL bound for tiny divergences).
    ``conversion="mironov"``: Mironov 2017, Prop. 3, ``min_α ε(α) + ln(1/δ)/(α-1)``.
    """
    if conversion == "mironov":
        with np.errstate(invalid="ignore"):
            eps = rdp + math.log(1.0 / target_delta) / (orders - 1.0)
        return float(np.min(eps))
    return float(rdp_privacy_accountant.compute_epsilon(orders, rdp, target_delta)[0])


def rdp_to_delta(
    orders: np.ndarray, rdp: np.ndarray, target_epsilon: float, conversion: str
) -> float:
    """Convert an RDP curve to δ at ``target_epsilon`` (inverse of :func:`rdp_to_epsilon`)."""
    if conversion == "mironov":
        with np.errstate(over="ignore", invalid="ignore"):
            log_delta = (orders - 1.0) * (rdp - target_epsilon)
        return float(min(1.0, math.exp(min(0.0, float(np.min(log_delta))))))
    return float(rdp_privacy_accountant.compute_delta(orders, rdp, target_epsilon)[0])


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
        self._runs: list[tuple[Any, int]] = []
        self._cache: dict[str, Any] = {}

    # ------------------------------------------------------------------ recording
    @property
    def runs(self) -> tuple[tuple[Any, int], ...]:
        """The ``(event, count)`` runs in recording order."""
        return tuple(self._runs)

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
            new_runs = self._runs[:-1] + [(event, self._runs[-1][1] + count)]
        else:
            new_runs = self._runs + [(event, count)]
        self._plan(new_runs)  # raises before anything changes
        self._runs = new_runs
        self._cache.clear()

    def _plan(self, runs: Sequence[tuple[Any, int]]) -> str:
        """Which computation answers for ``runs``: 'empty', 'single', 'pld-own', 'dp' or
        'rdp-mixed'."""
        if not runs:
            return "empty"
        own = [e for e, _ in runs if isinstance(e, FedprivEvent)]
        for e, _ in runs:
            if not isinstance(e, (FedprivEvent, dp_event.DpEvent)):
                raise ConfigError("event", e, "must be a dp_accounting DpEvent or a FedprivEvent")
        for e in own:
            if self.neighboring_relation not in e.supported_relations:
                raise IncompatibleEventsError(
                    f"{type(e).__name__} holds only for neighboring_relation in "
                    f"{sorted(e.supported_relations)}, not {self.neighboring_relation!r}"
                )
        if any(e.composes_by_pld for e in own):
            return self._plan_pld(runs)
        standalone = [e for e in own if not e.composes_by_rdp]
        if standalone:
            if len(runs) > 1:
                others = ", ".join(sorted({type(e).__name__ for e, _ in runs}))
                raise IncompatibleEventsError(
                    f"{type(standalone[0]).__name__} knows only its own (epsilon, delta) "
                    f"and cannot be composed with other events (ledger would hold: {others}); "
                    "keep it in a ledger of its own"
                )
            return "single"
        for e, _ in runs:
            if isinstance(e, dp_event.DpEvent):
                self._check_dp_supported(e)
        if own:
            if self.accountant != "rdp":
                raise IncompatibleEventsError(
                    f"{type(own[0]).__name__} is accounted by RDP only; use accountant='rdp'"
                )
            return "rdp-mixed"
        return "dp"

    def _plan_pld(self, runs: Sequence[tuple[Any, int]]) -> str:
        """Plan ``pld-own``: PLD-composable fedpriv events, self-composed and composed. Events
        whose class sets ``composes_with_own_kind`` compose with others of their class; any
        other must be the ledger's only run."""
        first = type(next(e for e, _ in runs if isinstance(e, FedprivEvent) and e.composes_by_pld))
        own_kind = first.composes_with_own_kind and all(type(e) is first for e, _ in runs)
        if len(runs) > 1 and not own_kind:
            names = ", ".join(sorted({type(e).__name__ for e, _ in runs}))
            raise IncompatibleEventsError(
                f"{first.__name__} composes only with itself (ledger would hold: "
                f"{names}); keep it in a ledger of its own"
            )
        if self.accountant != "pld":
            raise IncompatibleEventsError(
                f"{first.__name__} is accounted by its PLD only; use accountant='pld'"
            )
        return "pld-own"

    def _check_dp_supported(self, event: dp_event.DpEvent) -> None:
        relation = RELATIONS[self.neighboring_relation]
        if self.accountant == "pld":
            ok = pld_privacy_accountant.PLDAccountant(relation).supports(event)
        else:
            ok = rdp_privacy_accountant.RdpAccountant([2.0], relation).supports(event)
        if not ok:
            raise IncompatibleEventsError(
                f"{event} is not supported by the {self.accountant} accountant under "
                f"neighboring_relation={self.neighboring_relation!r}"
            )

    # ------------------------------------------------------------------ accounting
    def _integer_only(self) -> bool:
        """Whether a fedpriv RDP event (integer orders) is in the ledger."""
        return any(isinstance(e, FedprivEvent) for e, _ in self._runs)

    def _orders(self, integer_only: bool) -> np.ndarray:
        if self.conversion == "mironov":
            return MIRONOV_ORDERS
        return INTEGER_ORDERS if integer_only else COARSE_ORDERS

    def _rdp_supported(self) -> bool:
        """Whether the RDP accountant covers every run (it is the second bound under PLD)."""
        if "rdp_ok" not in self._cache:
            acc = rdp_privacy_accountant.RdpAccountant([2.0], RELATIONS[self.neighboring_relation])
            self._cache["rdp_ok"] = all(
                (e.composes_by_rdp if isinstance(e, FedprivEvent) else acc.supports(e))
                for e, _ in self._runs
            )
        return bool(self._cache["rdp_ok"])

    def _curve_at(self, orders: np.ndarray) -> np.ndarray:
        """Composed RDP curve of all runs at ``orders``."""
        relation = RELATIONS[self.neighboring_relation]
        total = np.zeros_like(orders)
        for e, c in self._runs:
            if isinstance(e, FedprivEvent):
                total = total + c * np.asarray(e.rdp(orders), dtype=float)
            else:
                total = total + c * event_rdp(e, orders, relation)
        return total

    def _rdp_curve(self) -> tuple[np.ndarray, np.ndarray]:
        """Composed RDP curve of all runs on the ledger's fixed grid (cached)."""
        if "rdp" not in self._cache:
            orders = self._orders(self._integer_only())
            self._cache["rdp"] = (orders, self._curve_at(orders))
        curve: tuple[np.ndarray, np.ndarray] = self._cache["rdp"]
        return curve

    def _refines(self) -> bool:
        """Whether the best order is searched beyond the fixed grid: dp-accounting events
        only (fractional orders), dp-accounting's conversion."""
        return self.conversion == "default" and not self._integer_only()

    def _rdp_epsilon(self, target_delta: float) -> float:
        """RDP ε at ``target_delta``, at the best order
        (:mod:`fedpriv.accounting.accountants.rdp`)."""
        if not self._refines():
            orders, rdp = self._rdp_curve()
            return rdp_to_epsilon(orders, rdp, target_delta, self.conversion)
        return best_over_orders(epsilon_objective(self._curve_at, target_delta))

    def _rdp_delta(self, target_epsilon: float) -> float:
        """RDP δ at ``target_epsilon``, at the best order."""
        if not self._refines():
            orders, rdp = self._rdp_curve()
            return rdp_to_delta(orders, rdp, target_epsilon, self.conversion)
        return best_over_orders(delta_objective(self._curve_at, target_epsilon))

    @property
    def pld_interval(self) -> float:
        """The PLD discretization interval used for the recorded runs."""
        if self.pld_discretization is not None:
            return self.pld_discretization
        if not self._runs or not self._rdp_supported():
            return PLD_GRIDS[0]
        orders, rdp = self._rdp_curve()
        scale = rdp_to_epsilon(orders, rdp, 1e-5, "default") / PLD_FINE_UP_TO
        for grid in PLD_GRIDS:
            if grid >= PLD_GRIDS[0] * scale:
                return grid
        return PLD_GRIDS[-1]

    def _pld(self) -> Any:
        """Composed PLD of all runs (cached): ``get_epsilon`` / ``get_delta`` answer."""
        if "pld" not in self._cache:
            event, count = self._runs[0]
            if isinstance(event, FedprivEvent):  # plan pld-own: the PLDs self-composed
                pld = event.pld().self_compose(count)
                for e, c in self._runs[1:]:
                    pld = compose_on_common_grid(pld, e.pld().self_compose(c))
                self._cache["pld"] = _OwnPld(pld)
                return self._cache["pld"]
            acc = pld_privacy_accountant.PLDAccountant(
                RELATIONS[self.neighboring_relation], self.pld_interval
            )
            for e, c in self._runs:
                acc.compose(e, c)
            self._cache["pld"] = acc
        return self._cache["pld"]

    def _exact_mu(self) -> float | None:
        """μ of the exact Gaussian answer, when the PLD accountant is asked and every run is a
        Gaussian mechanism without sampling (:func:`gaussian_noise_multiplier`): ``count``
        releases at multiplier σ are μ = √count/σ-GDP and μ² adds up (Dong, Roth, Su,
        arXiv:1905.02383, Cor. 3.3), whose profile is exact (Cor. 2.13). ``None`` otherwise."""
        return gaussian_mu(self._runs) if self.accountant == "pld" else None

    def _pld_feasible(self) -> bool:
        """Whether to build the PLD: not when the RDP bound is already beyond any use."""
        if not self._rdp_supported():
            return True
        orders, rdp = self._rdp_curve()
        return rdp_to_epsilon(orders, rdp, 1e-5, "default") <= PLD_MAX_RDP_EPSILON

    def analysis(self) -> str:
        """What answers for ε now: ``"pld"``, ``"rdp (CONVERSION)"``, or, for an event that
        stands alone, ``"NAME (own analysis)"`` (the accountant and conversion settings are then
        unused); ``"none"`` for an empty ledger."""
        plan = self._plan(self._runs)
        if plan == "empty":
            return "none"
        if plan == "single":
            return f"{type(self._runs[0][0]).__name__} (own analysis)"
        if self._exact_mu() is not None:
            return "gaussian (exact)"
        if plan == "pld-own" or (plan == "dp" and self.accountant == "pld"):
            return "pld"
        return f"rdp ({self.conversion})"

    def get_epsilon(self, target_delta: float) -> float:
        """ε of everything recorded, at ``target_delta`` (0 for an empty ledger).

        Raises
        ------
        ConfigError
            If ``target_delta`` is not in (0, 1).
        """
        check(0 < target_delta < 1, "target_delta", target_delta, "must be in (0, 1)")
        plan = self._plan(self._runs)
        if plan == "empty":
            return 0.0
        if plan == "single":
            event, count = self._runs[0]
            return _checked(float(event.epsilon(target_delta, count)), "epsilon")
        eps = math.inf
        if plan == "pld-own":
            return _checked(max(float(self._pld().get_epsilon(target_delta)), 0.0), "epsilon")
        mu = self._exact_mu()
        if mu is not None:
            return _checked(gdp_epsilon(target_delta, mu), "epsilon")
        if plan == "dp" and self.accountant == "pld" and self._pld_feasible():
            eps = float(self._pld().get_epsilon(target_delta))
        if self._rdp_supported():
            eps = min(eps, self._rdp_epsilon(target_delta))
        return _checked(max(eps, 0.0), "epsilon")

    def get_delta(self, target_epsilon: float) -> float:
        """δ of everything recorded, at ``target_epsilon`` (0 for an empty ledger).

        Raises
        ------
        ConfigError
            If ``target_epsilon`` is negative or NaN.
        """
        check(target_epsilon >= 0, "target_epsilon", target_epsilon, "must be >= 0")
        plan = self._plan(self._runs)
        if plan == "empty":
            return 0.0
        if plan == "single":
            event, count = self._runs[0]
            return _checked(float(event.delta(target_epsilon, count)), "delta")
        delta = 1.0
        if plan == "pld-own":
            return _checked(
                min(max(float(self._pld().get_delta(target_epsilon)), 0.0), 1.0), "delta"
            )
        mu = self._exact_mu()
        if mu is not None:
            return _checked(float(gdp_delta(target_epsilon, mu)), "delta")
        if plan == "dp" and self.accountant == "pld" and self._pld_feasible():
            delta = float(self._pld().get_delta(target_epsilon))
        if self._rdp_supported():
            delta = min(delta, self._rdp_delta(target_epsilon))
        return _checked(min(max(delta, 0.0), 1.0), "delta")

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


class _OwnPld:
    """A composed dp-accounting PLD with the accountant's ``get_epsilon`` / ``get_delta``."""

    def __init__(self, pld: Any) -> None:
        self.pld = pld

    def get_epsilon(self, target_delta: float) -> float:
        return float(self.pld.get_epsilon_for_delta(target_delta))

    def get_delta(self, target_epsilon: float) -> float:
        return float(self.pld.get_delta_for_epsilon(target_epsilon))


def gaussian_noise_multiplier(event: Any) -> float | None:
    """The noise multiplier of a dp-accounting event that is a Gaussian mechanism WITHOUT
    sampling (``GaussianDpEvent``; Poisson sampling at rate 1; sampling all N of N without
    replacement), per unit of the sensitivity under the ledger's relation; ``None`` for any
    other event."""
    if isinstance(event, dp_event.GaussianDpEvent):
        return float(event.noise_multiplier)
    if isinstance(event, dp_event.PoissonSampledDpEvent) and event.sampling_probability == 1:
        return gaussian_noise_multiplier(event.event)
    if isinstance(event, dp_event.SampledWithoutReplacementDpEvent) and (
        event.sample_size == event.source_dataset_size
    ):
        return gaussian_noise_multiplier(event.event)
    return None


def gaussian_mu(runs: Sequence[tuple[Any, int]]) -> float | None:
    """μ of ``runs`` (``[(event, count), ...]``) when every event is a Gaussian without
    sampling with σ > 0: ``count`` releases at σ are √count/σ-GDP and μ² adds up (Dong, Roth,
    Su, arXiv:1905.02383, Cor. 3.3); ``None`` for any other event or no runs."""
    mu2 = 0.0
    for event, count in runs:
        sigma = gaussian_noise_multiplier(event)
        if sigma is None or sigma <= 0:
            return None
        mu2 += count / sigma**2
    return math.sqrt(mu2) if runs else None


def event_to_dict(event: Any) -> dict[str, Any]:
    """JSON-able form of a dp-accounting event or a :class:`FedprivEvent`."""
    if isinstance(event, FedprivEvent):
        cls = type(event)
        return {"fedpriv_event": f"{cls.__module__}:{cls.__qualname__}", **event.to_dict()}
    if isinstance(event, dp_event.DpEvent):
        fields = {
            a.name: _dp_value_to_json(getattr(event, a.name)) for a in attr.fields(type(event))
        }
        return {"dp_event": type(event).__name__, **fields}
    raise ConfigError("event", event, "must be a dp_accounting DpEvent or a FedprivEvent")


def event_from_dict(d: dict[str, Any]) -> Any:
    """Inverse of :func:`event_to_dict`.

    Loads only dp-accounting event classes and :class:`FedprivEvent` subclasses, importing
    ``fedpriv.*`` modules on demand and other modules only if already imported.
    """
    d = dict(d)
    if "dp_event" in d:
        name = d.pop("dp_event")
        cls = getattr(dp_event, name, None)
        if not (isinstance(cls, type) and issubclass(cls, dp_event.DpEvent)):
            raise ConfigError("dp_event", name, "is not a dp_accounting DpEvent class")
        return cls(**{k: _dp_value_from_json(v) for k, v in d.items()})
    path = d.pop("fedpriv_event", None)
    module, _, name = str(path).partition(":")
    if module.startswith("fedpriv."):
        mod = importlib.import_module(module)
    elif module in sys.modules:  # a class defined elsewhere but already imported
        mod = sys.modules[module]
    else:
        raise ConfigError(
            "fedpriv_event", path, "must name a class in a fedpriv module (or an imported one)"
        )
    cls = getattr(mod, name, None)
    if not (isinstance(cls, type) and issubclass(cls, FedprivEvent)):
        raise ConfigError("fedpriv_event", path, "is not a FedprivEvent class")
    return cls.from_dict(d)


def _dp_value_to_json(v: Any) -> Any:
    if isinstance(v, dp_event.DpEvent):
        return event_to_dict(v)
    if isinstance(v, (list, tuple)):
        return [_dp_value_to_json(x) for x in v]
    return _plain(v)


def _dp_value_from_json(v: Any) -> Any:
    if isinstance(v, dict) and "dp_event" in v:
        return event_from_dict(v)
    if isinstance(v, list):
        return [_dp_value_from_json(x) for x in v]
    return v


def _plain(v: Any) -> Any:
    """numpy scalars and tuples to plain JSON types."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _tuples(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_tuples(x) for x in v)
    return v


def _checked(x: float, what: str) -> float:
    """Refuse to return NaN: a NaN ε/δ would silently pass any budget check."""
    if math.isnan(x):
        raise FloatingPointError(f"{what} computed as NaN; refusing to report it")
    return x


def _quiet_rdp_order_warnings() -> None:
    """dp-accounting logs a warning each time a fractional RDP order fails to converge and is
    excluded; excluding it is correct (the bound uses the other orders), so it is not shown."""

    class _Filter(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return "failed to converge" not in record.getMessage()

    logging.getLogger("absl").addFilter(_Filter())


_quiet_rdp_order_warnings()
