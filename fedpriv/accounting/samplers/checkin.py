"""The random check-in theorems in closed form: one pass's central ε of local randomizers.

Local randomizers are ``local_epsilon``-DP (``eps0``) or (``eps0``, ``local_delta``)-DP;
``n = num_clients``, ``m = num_slots``, ``p0 = checkin_probability``. Every bound is in the
replace-one relation of the paper (neighbouring data sets differ in one client's data).

Single pass, pure ``eps0`` (``L = ln(1/delta)``):

* ``fixed`` -- Theorem 3.2 (Algorithm 1, ``R_j = [m]``, any ``p0``):
  ``eps = p0 (e^eps0 - 1) sqrt(2 e^eps0 L / m) + p0^2 e^eps0 (e^eps0 - 1)^2 / (2m)``.
* ``averaged`` -- Theorem 4.1 (Algorithm 2, ``p0 = 1``), total delta ``delta + delta2``:
  ``eps = e^{4 eps0} (e^eps0 - 1)^2 eps1^2 / 2 + e^{2 eps0} (e^eps0 - 1) eps1 sqrt(2 L)``,
  ``eps1 = sqrt(1/n + 1/m) + sqrt(ln(1/delta2)/n)``. The pure form is RECONSTRUCTED from the
  printed (eps0, delta0) form by undoing its ``eps0 -> 8 eps0`` substitution.
* ``sliding-window`` -- Theorem 4.3 (``R_j = {j..j+m-1}``, ``p0 = 1``, ``m <= n``):
  ``eps = e^eps0 (e^eps0 - 1)^2 / (2m) + (e^eps0 - 1) sqrt(2 e^eps0 L / m)``.
* ``shuffle`` -- Theorem 5.1 (shuffling of ``n`` local randomizers):
  ``eps = e^{3 eps0} (e^eps0 - 1)^2 / (2n) + e^{3 eps0 / 2} (e^eps0 - 1) sqrt(2 L / n)``.

(eps0, delta0) randomizers: if ``delta0 <= (1 - e^-eps0) delta1 / (4 e^eps0 (2 + ln(2/delta1) /
ln(1/(1 - e^{-5 eps0}))))`` each theorem holds with ``eps0 -> 8 eps0`` and
``delta' = delta + K (e^{eps'} + 1) delta1`` (``K = m`` for 3.2, 4.1, 4.3 and ``n`` for 5.1; 4.1
adds ``delta2``); :func:`single_pass_epsilon` optimises the split of the total delta.

Dummy updates: the expected number of empty slots (Theorem 3.4 and the sliding-window bound),
:func:`expected_dummy_updates`.

References
----------
Balle, Bell, Gascon, Kairouz, Thakurta, "Privacy Amplification via Random Check-Ins"
(arXiv:2007.06605), Theorems 3.2, 3.4, 4.1, 4.3, 5.1.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedpriv.common.errors import ConfigError
from fedpriv.mechanisms.checkin_draw import CheckinVariant

__all__ = [
    "VARIANTS",
    "THEOREMS",
    "pure_epsilon",
    "delta0_bound",
    "min_delta1",
    "PassParams",
    "single_pass_epsilon",
    "expected_dummy_updates",
]

#: The variants a check-in theorem accounts (:class:`fedpriv.accounting.checkin.events.
#: CheckinEvent`).
VARIANTS = (
    CheckinVariant.FIXED,
    CheckinVariant.AVERAGED,
    CheckinVariant.SLIDING_WINDOW,
    CheckinVariant.SHUFFLE,
)
#: The paper's theorem behind each variant.
THEOREMS = {
    CheckinVariant.FIXED: "Theorem 3.2",
    CheckinVariant.AVERAGED: "Theorem 4.1",
    CheckinVariant.SLIDING_WINDOW: "Theorem 4.3",
    CheckinVariant.SHUFFLE: "Theorem 5.1",
}


# --------------------------------------------------------------------------- formulas
def _eps1(num_clients: int, num_slots: int, delta2: float) -> float:
    """``eps1`` of Theorem 4.1."""
    return math.sqrt(1.0 / num_clients + 1.0 / num_slots) + math.sqrt(
        math.log(1.0 / delta2) / num_clients
    )


def pure_epsilon(
    variant: str,
    local_epsilon: float,
    num_clients: int,
    num_slots: int,
    delta: float,
    checkin_probability: float = 1.0,
    delta2: float | None = None,
) -> float:
    """The theorem's central epsilon for an ``eps0``-DP randomizer (one pass).

    Source: Balle, Bell, Gascon, Kairouz, Thakurta, arXiv:2007.06605, Theorem 3.2 (``fixed``),
    Theorem 4.1 (``averaged``; its pure form reconstructed, see the module docstring), Theorem
    4.3 (``sliding-window``), Theorem 5.1 (``shuffle``). Hypotheses: the replace-one relation
    (one client's data changes); a pure ``eps0``-DP local randomizer applied to every report;
    each client checks in with its own randomness (the server never picks clients) under the
    variant's protocol: ``fixed`` Algorithm 1 (window ``[m]``, probability ``p0``, one update
    per slot chosen uniformly among those checked in, a dummy when none), ``averaged``
    Algorithm 2 (``p0 = 1``, the server averages), ``sliding-window`` (``p0 = 1``, ``m <= n``),
    ``shuffle`` (``n`` reports uniformly permuted).

    Parameters
    ----------
    variant : {"fixed", "averaged", "sliding-window", "shuffle"}
    local_epsilon : float
        ``eps0`` (pass ``8 eps0`` to get the (eps0, delta0) forms).
    num_clients, num_slots : int
        ``n``, ``m`` (``m`` unused by ``shuffle``).
    delta : float
        The theorem's ``delta`` in (0, 1) (without ``delta2`` and ``delta1`` terms).
    checkin_probability : float
        ``p0`` (only Theorem 3.2 has it; the others need ``p0 = 1``).
    delta2 : float, optional
        Theorem 4.1's ``delta2`` in (0, 1) (required for ``averaged``).

    Returns
    -------
    float
        Central epsilon (may overflow to ``inf`` for huge ``eps0``; never NaN).
    """
    e0 = float(local_epsilon)
    log_term = math.log(1.0 / delta)
    try:
        ex = math.exp(e0)
    except OverflowError:
        return math.inf
    em1 = math.expm1(e0)
    m, n, p = num_slots, num_clients, checkin_probability
    with np.errstate(over="ignore"):
        if variant == "fixed":
            val = p * em1 * math.sqrt(2.0 * ex * log_term / m) + p * p * ex * em1 * em1 / (2.0 * m)
        elif variant == "averaged":
            assert delta2 is not None
            e1 = _eps1(n, m, delta2)
            val = float(np.exp(4 * e0)) * em1 * em1 * e1 * e1 / 2.0 + float(
                np.exp(2 * e0)
            ) * em1 * e1 * math.sqrt(2.0 * log_term)
        elif variant == "sliding-window":
            val = ex * em1 * em1 / (2.0 * m) + em1 * math.sqrt(2.0 * ex * log_term / m)
        elif variant == "shuffle":
            val = float(np.exp(3 * e0)) * em1 * em1 / (2.0 * n) + float(
                np.exp(1.5 * e0)
            ) * em1 * math.sqrt(2.0 * log_term / n)
        else:
            raise ConfigError("variant", variant, "must be one of: " + ", ".join(VARIANTS))
    return val if math.isfinite(val) else math.inf


def delta0_bound(local_epsilon: float, delta1: float) -> float:
    """Largest ``delta0`` the (eps0, delta0) forms accept for a given ``delta1``.

    ``(1 - e^-eps0) delta1 / (4 e^eps0 (2 + ln(2/delta1) / ln(1/(1 - e^{-5 eps0}))))``
    (identical in Theorems 3.2, 4.1, 4.3, 5.1 of arXiv:2007.06605), evaluated in log space: for
    a huge ``eps0`` it underflows to 0 (no ``delta0 > 0`` qualifies) instead of overflowing or
    dividing by 0.

    Hypotheses: an (``eps0``, ``delta0``)-DP local randomizer under the replace-one relation;
    when ``delta0`` is at most this bound, each theorem holds with ``eps0 -> 8 eps0`` and
    ``delta' = delta + K (e^{eps'} + 1) delta1`` (module docstring).
    """
    e0 = float(local_epsilon)
    t = -5.0 * e0
    # log(ln(1/(1 - e^t))) = log(-log1p(-e^t)); for e^t below ~1e-300 it is t to double precision
    log_denom = math.log(-math.log1p(-math.exp(t))) if t > -690.0 else t
    log_inner = np.logaddexp(math.log(2.0), math.log(math.log(2.0 / delta1)) - log_denom)
    log_bound = (
        math.log(-math.expm1(-e0)) + math.log(delta1) - math.log(4.0) - e0 - float(log_inner)
    )
    return math.exp(log_bound) if log_bound > -745.0 else 0.0


def min_delta1(local_epsilon: float, local_delta: float) -> float:
    """Smallest ``delta1`` in (0, 1) with ``local_delta <= delta0_bound(eps0, delta1)``.

    The precondition of the (``eps0``, ``delta0``) forms of Theorems 3.2, 4.1, 4.3 and 5.1
    (arXiv:2007.06605); hypotheses as :func:`delta0_bound` (replace-one relation). The
    smallest ``delta1`` gives the smallest ``K (e^{eps'} + 1) delta1`` term.

    Raises
    ------
    ConfigError
        If no ``delta1 < 1`` satisfies the precondition.
    """
    hi = 1.0 - 1e-12
    if delta0_bound(local_epsilon, hi) < local_delta:
        raise ConfigError(
            "local_delta",
            local_delta,
            f"violates the (eps0, delta0) precondition of the check-in theorems for every "
            f"delta1 < 1 at local_epsilon={local_epsilon} (need delta0 <= "
            f"{delta0_bound(local_epsilon, hi):.3g} even at delta1 -> 1)",
        )
    lo_log, hi_log = math.log(1e-300), math.log(hi)
    if delta0_bound(local_epsilon, 1e-300) >= local_delta:
        return 1e-300
    for _ in range(200):
        mid = 0.5 * (lo_log + hi_log)
        if delta0_bound(local_epsilon, math.exp(mid)) >= local_delta:
            hi_log = mid
        else:
            lo_log = mid
    d1 = math.exp(hi_log)
    while delta0_bound(local_epsilon, d1) < local_delta:
        d1 *= 1.0 + 1e-12
    return d1


# --------------------------------------------------------------------------- one pass
@dataclass(frozen=True)
class PassParams:
    """Parameters of one protocol pass (validated by
    :class:`fedpriv.accounting.checkin.events.CheckinEvent`)."""

    variant: str
    local_epsilon: float
    num_clients: int
    num_slots: int
    checkin_probability: float
    local_delta: float
    delta1: float | None
    delta2: float | None

    @property
    def k_factor(self) -> int:
        return self.num_clients if self.variant == "shuffle" else self.num_slots

    def eps_at(self, delta: float, delta2: float | None) -> float:
        e0 = self.local_epsilon if self.local_delta == 0.0 else 8.0 * self.local_epsilon
        return pure_epsilon(
            self.variant,
            e0,
            self.num_clients,
            self.num_slots,
            delta,
            self.checkin_probability,
            delta2,
        )


def _largest_feasible(h: Callable[[float], bool], top: float) -> float | None:
    """Largest ``x`` in (0, top) on a log grid (then refined) with ``h(x)`` true, or None."""
    grid = top * np.logspace(0, -30, 301)[1:]
    prev = top
    for x in grid:
        if h(float(x)):
            lo, hi = float(x), prev
            for _ in range(60):
                mid = math.sqrt(lo * hi)
                if h(mid):
                    lo = mid
                else:
                    hi = mid
            return lo
        prev = float(x)
    return None


def _pass_epsilon_fixed_split(p: PassParams, total_delta: float, delta2: float | None) -> float:
    """Best epsilon of one pass for a given ``delta2``; ``inf`` if the split is infeasible."""
    budget = total_delta - (delta2 or 0.0)
    if budget <= 0.0:
        return math.inf
    if p.local_delta == 0.0:
        return p.eps_at(budget, delta2)
    d1 = p.delta1 if p.delta1 is not None else min_delta1(p.local_epsilon, p.local_delta)
    k = p.k_factor

    def used(d: float) -> float:
        eps = p.eps_at(d, delta2)
        if not math.isfinite(eps) or eps > 700:
            return math.inf
        return d + k * (math.exp(eps) + 1.0) * d1

    best = _largest_feasible(lambda d: used(d) <= budget, budget)
    return math.inf if best is None else p.eps_at(best, delta2)


def single_pass_epsilon(p: PassParams, total_delta: float) -> float:
    """Smallest epsilon of one pass at total delta ``total_delta`` over the delta splits.

    :func:`pure_epsilon` (arXiv:2007.06605, Theorems 3.2, 4.1, 4.3, 5.1; with ``8 eps0`` and
    the ``K (e^{eps'} + 1) delta1`` term for (``eps0``, ``delta0``) randomizers) at each split
    of ``total_delta`` into the theorem's ``delta``, ``delta2`` (Theorem 4.1) and the
    ``delta1`` term: every split tried is a valid guarantee, so their minimum is too.
    Hypotheses: those of :func:`pure_epsilon` (replace-one relation, one pass of fresh
    check-ins) and, for ``local_delta > 0``, ``local_delta <= delta0_bound(eps0, delta1)``.
    """
    if p.variant != "averaged":
        return _pass_epsilon_fixed_split(p, total_delta, None)
    if p.delta2 is not None:
        return _pass_epsilon_fixed_split(p, total_delta, p.delta2)
    fracs = np.concatenate([np.logspace(-6, -1, 11), np.linspace(0.15, 0.95, 17)])
    return min(_pass_epsilon_fixed_split(p, total_delta, float(f) * total_delta) for f in fracs)


# --------------------------------------------------------------------------- dummies
def expected_dummy_updates(
    variant: str, num_clients: int, num_slots: int, checkin_probability: float = 1.0
) -> dict[str, float]:
    """Expected number of empty slots (dummy updates, or skipped slots for ``averaged``).

    Returns ``{"expected": exact expectation, "bound": the paper's bound}``:
    fixed / averaged ``m (1 - p0/m)^n`` (Theorem 3.4; exact); sliding window
    ``(n - m + 1)(1 - 1/m)^m`` exact and ``(n - m + 1)/e`` (the paper's bound).
    ``shuffle`` has none. Not a privacy bound (arXiv:2007.06605, Theorem 3.4 and Section 4);
    hypotheses: each client checks in independently, with probability ``p0``, at a slot
    uniform over its window.
    """
    n, m, p = num_clients, num_slots, checkin_probability
    if variant in ("fixed", "averaged"):
        v = m * math.exp(n * math.log1p(-p / m)) if p < m else 0.0
        return {"expected": v, "bound": v}
    if variant == "sliding-window":
        slots = n - m + 1
        v = slots * math.exp(m * math.log1p(-1.0 / m)) if m > 1 else 0.0
        return {"expected": v, "bound": slots / math.e}
    return {"expected": 0.0, "bound": 0.0}
