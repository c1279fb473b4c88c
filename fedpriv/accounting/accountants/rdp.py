"""RDP of dp-accounting events at the order that gives the smallest ε (or δ).

An RDP bound converts to (ε, δ) at every order α > 1; each answer is valid, the smallest is the
tightest. A fixed grid loses where the best order falls between its points: at Poisson
q = 0.001, σ = 3, one round, dp-accounting's default grid answers ε = 0.1029 at δ = 1e-5,
the best order 0.046; at q = 0.1, σ = 0.5, 1000 rounds the best order (α ≈ 1.65) lies at the
edge of the fractional orders whose series converge, and the grid answers 236.5 for 208.9.
Here the composed curve is first evaluated on :data:`COARSE_ORDERS` (dp-accounting's defaults,
orders near 1 for large ε, large orders for tiny ε), then, :data:`REFINE_ROUNDS` times, on
:data:`REFINE_POINTS` orders between the neighbours of the best one. Every order tried is a
valid bound, so refining can only lower the answer towards the true minimum over α.

Each event's curve is cached order by order (:func:`event_rdp`), so a ledger that gains one
round at a time recomputes only the few refined orders.

:class:`RdpAccountant` is the ledger's RDP accountant (``accountant="rdp"``, and the second
bound of ``accountant="pld"``): the curves of dp-accounting events and of RDP-composable
fedpriv events (``composes_by_rdp``, integer orders) add up, and the sum converts to (ε, δ) by
dp-accounting's conversion or by Mironov's (:func:`rdp_to_epsilon`).

References
----------
Mironov, "Rényi Differential Privacy" (arXiv:1702.07476), Prop. 3; Canonne, Kamath, Steinke
(arXiv:2004.00010), Prop. 12 (dp-accounting's ``compute_epsilon``); Mironov, Talwar, Zhang
(arXiv:1908.10530), fractional orders of the sampled Gaussian; Asoodeh, Liao, Calmon,
Kosut, Sankar (arXiv:2001.05990), the conversion dp-accounting implements beside Prop. 12.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, ClassVar

import numpy as np
from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant

from fedpriv.accounting.core.accountant import (
    RELATIONS,
    AccountingSettings,
    Runs,
    RunsMemo,
    own_events,
    unsupported_dp_event,
)

#: dp-accounting's default orders (fractional ones included).
DEFAULT_ORDERS = np.array(rdp_privacy_accountant.DEFAULT_RDP_ORDERS, dtype=float)
#: The first grid: the defaults, 1 + 1e-3 .. 1 + 0.1 (ε in the hundreds and above) and large
#: orders up to 2^16 (ε far below 0.1).
COARSE_ORDERS = np.unique(
    np.concatenate([DEFAULT_ORDERS, 1.0 + np.geomspace(1e-3, 0.1, 12), 2.0 ** np.arange(10, 17)])
)
#: Orders per refinement between the best order's neighbours, and the number of refinements
#: (each narrows the bracket ~12-fold: 3 rounds leave < 0.1 % of ε on the table).
REFINE_POINTS = 25
REFINE_ROUNDS = 3
#: Orders of Mironov's original conversion, integers 2..255 (the published numbers of Heikkilä,
#: "On Using Secure Aggregation in Differentially Private Federated Learning with Multiple
#: Local Steps").
MIRONOV_ORDERS = np.arange(2, 256, dtype=float)
#: Integer orders used whenever a fedpriv RDP event is in the runs.
INTEGER_ORDERS = np.concatenate([np.arange(2, 256), [384, 512, 768, 1024]]).astype(float)

_CACHE: dict[tuple[Any, Any, float], float] = {}
_CACHE_LIMIT = 200_000


def event_rdp(
    event: dp_event.DpEvent, orders: np.ndarray, relation: NeighboringRelation
) -> np.ndarray:
    """RDP of ONE occurrence of a dp-accounting event at ``orders`` (shape of ``orders``),
    ``inf`` where dp-accounting has no finite value.

    For a Poisson-sampled event the curve is capped by the unsampled one, order by order
    (subsampling never hurts under add/remove: joint convexity of Rényi divergence).
    dp-accounting drops fractional orders whose series fail to converge (small σ, large q)
    and would otherwise report *more* ε at q = 0.75 than at q = 1.

    The curves are dp-accounting's: the Poisson-sampled Gaussian of Mironov, Talwar, Zhang
    (arXiv:1908.10530), sampling without replacement by Wang, Balle, Kasiviswanathan
    (arXiv:1808.00087, Theorem 9). Hypotheses: ``relation`` is the run's neighbouring
    relation and the event is one dp-accounting covers under it (its accountant refuses the
    others: Poisson sampling is add/remove, sampling without replacement replace-one); the
    cap by the unsampled curve holds under add/remove, where the sampled pair is a mixture of
    the unsampled pairs.
    """
    orders = np.asarray(orders, dtype=float)
    missing = [a for a in orders.tolist() if (event, relation, a) not in _CACHE]
    if missing:
        if len(_CACHE) > _CACHE_LIMIT:
            _CACHE.clear()
        for a, r in zip(missing, _compute(event, missing, relation), strict=True):
            _CACHE[(event, relation, a)] = float(r)
    return np.array([_CACHE[(event, relation, a)] for a in orders.tolist()], dtype=float)


def _compute(
    event: dp_event.DpEvent, orders: Sequence[float], relation: NeighboringRelation
) -> np.ndarray:
    acc = rdp_privacy_accountant.RdpAccountant(list(orders), relation)
    acc.compose(event, 1)
    rdp = np.asarray(acc.rdp, dtype=float)
    if isinstance(event, dp_event.PoissonSampledDpEvent):
        inner = rdp_privacy_accountant.RdpAccountant(list(orders), relation)
        if inner.supports(event.event):
            inner.compose(event.event, 1)
            rdp = np.minimum(rdp, np.asarray(inner.rdp, dtype=float))
    return rdp


def best_over_orders(objective: Callable[[np.ndarray], np.ndarray]) -> float:
    """The smallest value of ``objective(orders)`` (one value per order, ``inf`` where the
    order has no bound) over :data:`COARSE_ORDERS`, refined between the neighbours of the
    best order; ``inf`` when no order gives a finite value."""
    orders = COARSE_ORDERS
    values = objective(orders)
    best = float(np.min(values))
    for _ in range(REFINE_ROUNDS):
        if not np.isfinite(best):
            break
        i = int(np.argmin(values))
        lo = orders[i - 1] if i > 0 else 1.0 + (orders[i] - 1.0) / 2.0
        hi = orders[i + 1] if i + 1 < len(orders) else orders[i] * 2.0
        orders = 1.0 + np.geomspace(lo - 1.0, hi - 1.0, REFINE_POINTS)
        values = objective(orders)
        best = min(best, float(np.min(values)))
    return best


def epsilon_objective(
    curve: Callable[[np.ndarray], np.ndarray], target_delta: float
) -> Callable[[np.ndarray], np.ndarray]:
    """ε at ``target_delta`` order by order for a composed curve (dp-accounting's conversion,
    Canonne, Kamath, Steinke 2020, arXiv:2004.00010, Prop. 12, with its KL bound for tiny
    divergences). Hypotheses: ``curve`` bounds the composed mechanism's Rényi divergence at
    every order it is asked for, for one neighbouring relation (any), in both orders of the
    pair where the relation is symmetric; every order α > 1 gives a valid ε.
    """

    def objective(orders: np.ndarray) -> np.ndarray:
        rdp = curve(orders)
        return np.array(
            [
                rdp_privacy_accountant.compute_epsilon([a], [r], target_delta)[0]
                if np.isfinite(r)
                else np.inf
                for a, r in zip(orders, rdp, strict=True)
            ]
        )

    return objective


def delta_objective(
    curve: Callable[[np.ndarray], np.ndarray], target_epsilon: float
) -> Callable[[np.ndarray], np.ndarray]:
    """δ at ``target_epsilon`` order by order (the inverse conversion of
    :func:`epsilon_objective`: Canonne, Kamath, Steinke, arXiv:2004.00010, Prop. 12).
    Hypotheses: as :func:`epsilon_objective` (``curve`` bounds the composed mechanism's RDP
    under one neighbouring relation).
    """

    def objective(orders: np.ndarray) -> np.ndarray:
        rdp = curve(orders)
        return np.array(
            [
                rdp_privacy_accountant.compute_delta([a], [r], target_epsilon)[0]
                if np.isfinite(r)
                else 1.0
                for a, r in zip(orders, rdp, strict=True)
            ]
        )

    return objective


def rdp_to_epsilon(
    orders: np.ndarray, rdp: np.ndarray, target_delta: float, conversion: str
) -> float:
    """Convert an RDP curve to ε at ``target_delta``, the smallest over ``orders``.

    ``conversion="default"``: dp-accounting's ``compute_epsilon`` (Canonne, Kamath, Steinke
    2020, Prop. 12 / Asoodeh et al. 2020, with the KL bound for tiny divergences).
    ``conversion="mironov"``: Mironov 2017, Prop. 3, ``min_α ε(α) + ln(1/δ)/(α-1)``.
    Hypothesis: ``rdp`` bounds the mechanism's Rényi divergence at each of ``orders`` (> 1), in
    both directions of the neighbouring relation; each order then gives a valid ε.
    """
    if conversion == "mironov":
        with np.errstate(invalid="ignore"):
            eps = rdp + math.log(1.0 / target_delta) / (orders - 1.0)
        return float(np.min(eps))
    return float(rdp_privacy_accountant.compute_epsilon(orders, rdp, target_delta)[0])


def rdp_to_delta(
    orders: np.ndarray, rdp: np.ndarray, target_epsilon: float, conversion: str
) -> float:
    """Convert an RDP curve to δ at ``target_epsilon``, the smallest over ``orders`` (inverse
    of :func:`rdp_to_epsilon`): dp-accounting's ``compute_delta`` (Canonne, Kamath, Steinke
    2020, Prop. 12) or Mironov 2017, Prop. 3, ``δ = exp((α − 1)(ε(α) − ε))``. Same hypothesis:
    ``rdp`` bounds the Rényi divergence at each order under the neighbouring relation."""
    if conversion == "mironov":
        with np.errstate(over="ignore", invalid="ignore"):
            log_delta = (orders - 1.0) * (rdp - target_epsilon)
        return float(min(1.0, math.exp(min(0.0, float(np.min(log_delta))))))
    return float(rdp_privacy_accountant.compute_delta(orders, rdp, target_epsilon)[0])


class RdpAccountant:
    """Rényi DP: the runs' RDP curves added up, converted to (ε, δ) at the best order.

    Composition: if each mechanism is (α, ε_i(α))-RDP, their adaptive composition is
    (α, Σ ε_i(α))-RDP at every order α (Mironov, arXiv:1702.07476, Prop. 1). It holds here
    because every base curve bounds its event at every order it is evaluated at:
    dp-accounting's curves (the Poisson-subsampled Gaussian: Mironov, Talwar, Zhang,
    arXiv:1908.10530, capped by the unsampled curve, :func:`event_rdp`) at any order, a fedpriv
    event's ``rdp`` (``composes_by_rdp``) at integer orders only, so the curve of runs holding
    one is summed on :data:`INTEGER_ORDERS`. Conversion: dp-accounting's (Canonne, Kamath,
    Steinke, arXiv:2004.00010, Prop. 12; Asoodeh et al. arXiv:2001.05990), at the best order
    (:func:`best_over_orders`) when only dp-accounting events are recorded; else, and with
    ``conversion="mironov"`` (Mironov 2017, Prop. 3, on :data:`MIRONOV_ORDERS`), on the fixed
    grid. Every order gives a valid bound, so the smallest over those tried is one.

    Parameters
    ----------
    settings : AccountingSettings
        The conversion and the neighbouring relation (the PLD grid is unused).
    """

    upper_bound: ClassVar[bool] = True

    def __init__(self, settings: AccountingSettings | None = None) -> None:
        self.settings = settings or AccountingSettings()
        self.conversion = self.settings.conversion
        self.relation = RELATIONS[self.settings.neighboring_relation]
        self._memo = RunsMemo()

    def refusal(self, runs: Runs) -> str | None:
        """``None`` when every run has an RDP curve here; else the first reason."""
        for e in own_events(runs):
            if e.composes_by_pld:
                return f"{type(e).__name__} is accounted by its PLD only; use accountant='pld'"
        supports = rdp_privacy_accountant.RdpAccountant([2.0], self.relation).supports
        reason = unsupported_dp_event(runs, supports, "rdp", self.settings.neighboring_relation)
        if reason is None and not self.covers(runs):
            return "an event that knows only its own (epsilon, delta) has no RDP curve"
        return reason

    def covers(self, runs: Runs) -> bool:
        """Whether every run has an RDP curve (it is also the second bound under PLD)."""

        def compute() -> bool:
            acc = rdp_privacy_accountant.RdpAccountant([2.0], self.relation)
            return all(
                (acc.supports(e) if isinstance(e, dp_event.DpEvent) else e.composes_by_rdp)
                for e, _ in runs
            )

        return bool(self._memo.get(runs, "covers", compute))

    def curve_at(self, runs: Runs, orders: np.ndarray) -> np.ndarray:
        """Composed RDP curve of all runs at ``orders`` (Prop. 1: the curves add up)."""
        total = np.zeros_like(orders)
        for e, c in runs:
            if isinstance(e, dp_event.DpEvent):
                total = total + c * event_rdp(e, orders, self.relation)
            else:
                total = total + c * np.asarray(e.rdp(orders), dtype=float)
        return total

    def curve(self, runs: Runs) -> tuple[np.ndarray, np.ndarray]:
        """``(orders, curve)`` of all runs on the fixed grid: :data:`MIRONOV_ORDERS` for
        Mironov's conversion, :data:`INTEGER_ORDERS` with a fedpriv event, else
        :data:`COARSE_ORDERS` (cached per runs)."""

        def compute() -> tuple[np.ndarray, np.ndarray]:
            if self.conversion == "mironov":
                orders = MIRONOV_ORDERS
            else:
                orders = INTEGER_ORDERS if own_events(runs) else COARSE_ORDERS
            return orders, self.curve_at(runs, orders)

        return self._memo.get(runs, "curve", compute)

    def _refines(self, runs: Runs) -> bool:
        """Whether the best order is searched beyond the fixed grid: dp-accounting events
        only (fractional orders), dp-accounting's conversion."""
        return self.conversion == "default" and not own_events(runs)

    def bound_epsilon(self, runs: Runs, target_delta: float) -> float:
        """RDP ε at ``target_delta`` at the best order (unclamped)."""
        if not self._refines(runs):
            orders, rdp = self.curve(runs)
            return rdp_to_epsilon(orders, rdp, target_delta, self.conversion)
        return best_over_orders(epsilon_objective(partial(self.curve_at, runs), target_delta))

    def bound_delta(self, runs: Runs, target_epsilon: float) -> float:
        """RDP δ at ``target_epsilon`` at the best order (unclamped)."""
        if not self._refines(runs):
            orders, rdp = self.curve(runs)
            return rdp_to_delta(orders, rdp, target_epsilon, self.conversion)
        return best_over_orders(delta_objective(partial(self.curve_at, runs), target_epsilon))

    def epsilon(self, runs: Runs, target_delta: float) -> float:
        """ε of all runs at ``target_delta`` (>= 0; ``inf`` if a run has no curve)."""
        eps = math.inf
        if self.covers(runs):
            eps = min(eps, self.bound_epsilon(runs, target_delta))
        return max(eps, 0.0)

    def delta(self, runs: Runs, target_epsilon: float) -> float:
        """δ of all runs at ``target_epsilon`` (in [0, 1])."""
        delta = 1.0
        if self.covers(runs):
            delta = min(delta, self.bound_delta(runs, target_epsilon))
        return min(max(delta, 0.0), 1.0)

    def analysis(self, runs: Runs) -> str:
        """``"rdp (CONVERSION)"``."""
        return f"rdp ({self.conversion})"


def _quiet_rdp_order_warnings() -> None:
    """dp-accounting logs a warning each time a fractional RDP order fails to converge and is
    excluded; excluding it is correct (the bound uses the other orders), so it is not shown."""

    class _Filter(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return "failed to converge" not in record.getMessage()

    logging.getLogger("absl").addFilter(_Filter())


_quiet_rdp_order_warnings()
