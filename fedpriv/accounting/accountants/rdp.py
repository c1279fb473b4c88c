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

References
----------
Mironov, "Rényi Differential Privacy" (arXiv:1702.07476), Prop. 3; Canonne, Kamath, Steinke
(arXiv:2004.00010), Prop. 12 (dp-accounting's ``compute_epsilon``); Mironov, Talwar, Zhang
(arXiv:1908.10530), fractional orders of the sampled Gaussian.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant

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
