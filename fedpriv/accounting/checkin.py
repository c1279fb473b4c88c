"""Privacy amplification via random check-ins: the paper's theorems, composed over passes.

Local randomizers are ``local_epsilon``-DP (``eps0``) or (``eps0``, ``local_delta``)-DP;
``n = num_clients``, ``m = num_slots``, ``p0 = checkin_probability``. Every bound is in the
replace-one relation of the paper (neighbouring data sets differ in one client's record).

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
adds ``delta2``). Otherwise the analysis is refused.

Several passes (Corollary 3.3 style, fresh check-ins per pass): the best of basic,
advanced (Dwork, Rothblum, Vadhan 2010) and optimal (Kairouz, Oh, Viswanath 2015, Thm 3.3)
composition of the per-pass (eps, delta) guarantee, over a grid of per-pass delta.

References
----------
Balle, Bell, Gascon, Kairouz, Thakurta, "Privacy Amplification via Random Check-Ins"
(../shared/papers/random-check-ins.txt), Theorems 3.2, 4.1, 4.3, 5.1, Corollary 3.3,
Theorem 3.4 (dummy updates) and the sliding-window dummy bound. PRIVACY-SPEC section 2.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import scipy.special

from fedpriv.accounting import gdp
from fedpriv.accounting.ledger import FedprivEvent
from fedpriv.accounting.params import _MISSING as _REQUIRED
from fedpriv.accounting.params import Params
from fedpriv.errors import ConfigError, check

__all__ = [
    "VARIANTS",
    "pure_epsilon",
    "delta0_bound",
    "min_delta1",
    "single_pass_epsilon",
    "compose_repetitions",
    "optimal_composition_delta",
    "advanced_composition_epsilon",
    "expected_dummy_updates",
    "CheckinEvent",
    "run_cli",
]

VARIANTS = ("fixed", "averaged", "sliding-window", "shuffle")
_THEOREM = {
    "fixed": "Theorem 3.2",
    "averaged": "Theorem 4.1",
    "sliding-window": "Theorem 4.3",
    "shuffle": "Theorem 5.1",
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
    (identical in Theorems 3.2, 4.1, 4.3, 5.1).
    """
    e0 = float(local_epsilon)
    denom_log = -math.log1p(-math.exp(-5.0 * e0))
    return (
        (-math.expm1(-e0))
        * delta1
        / (4.0 * math.exp(e0) * (2.0 + math.log(2.0 / delta1) / denom_log))
    )


def min_delta1(local_epsilon: float, local_delta: float) -> float:
    """Smallest ``delta1`` in (0, 1) with ``local_delta <= delta0_bound(eps0, delta1)``.

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
            f"violates the (eps0, delta0) precondition for every delta1 < 1 at "
            f"local_epsilon={local_epsilon} (need delta0 <= "
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
class _Pass:
    """Parameters of one protocol pass (validated by :class:`CheckinEvent`)."""

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


def _pass_epsilon_fixed_split(p: _Pass, total_delta: float, delta2: float | None) -> float:
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


def single_pass_epsilon(p: _Pass, total_delta: float) -> float:
    """Smallest epsilon of one pass at total delta ``total_delta`` over the delta splits."""
    if p.variant != "averaged":
        return _pass_epsilon_fixed_split(p, total_delta, None)
    if p.delta2 is not None:
        return _pass_epsilon_fixed_split(p, total_delta, p.delta2)
    fracs = np.concatenate([np.logspace(-6, -1, 11), np.linspace(0.15, 0.95, 17)])
    return min(_pass_epsilon_fixed_split(p, total_delta, float(f) * total_delta) for f in fracs)


# --------------------------------------------------------------------------- composition
def optimal_composition_delta(
    epsilon: float, delta: float, count: int, total_epsilon: float
) -> float:
    """Exact delta of the ``count``-fold composition of (epsilon, delta)-DP at ``total_epsilon``.

    ``1 - (1 - delta)^k (1 - sum_l C(k,l) [e^{(k-l) eps} - e^{eps_g + l eps}]_+ / (1 + e^eps)^k)``,
    the hockey-stick divergence of ``k`` copies of the canonical (eps, delta) pair, valid at
    every ``eps_g >= 0``.

    References
    ----------
    Kairouz, Oh, Viswanath (2015), "The Composition Theorem for Differential Privacy",
    Theorem 3.3; Murtagh, Vadhan (2016).
    """
    k = int(count)
    if epsilon == 0.0:
        pure = 0.0
    else:
        ls = np.arange(k + 1, dtype=float)
        ok = (k - 2 * ls) * epsilon > total_epsilon
        ls = ls[ok]
        if ls.size == 0:
            pure = 0.0
        else:
            log_binom = (
                scipy.special.gammaln(k + 1)
                - scipy.special.gammaln(ls + 1)
                - scipy.special.gammaln(k - ls + 1)
            )
            log_terms = (
                log_binom
                + (k - ls) * epsilon
                - k * np.logaddexp(0.0, epsilon)
                + np.log(-np.expm1(total_epsilon - (k - 2 * ls) * epsilon))
            )
            top = float(log_terms.max())
            pure = math.exp(top) * float(np.exp(log_terms - top).sum())
    pure = min(max(pure, 0.0), 1.0)
    return float(-np.expm1(k * np.log1p(-delta)) + np.exp(k * np.log1p(-delta)) * pure)


def advanced_composition_epsilon(epsilon: float, count: int, delta_slack: float) -> float:
    """``sqrt(2k ln(1/delta_slack)) eps + k eps (e^eps - 1)`` (Dwork, Rothblum, Vadhan 2010)."""
    k = int(count)
    return math.sqrt(2.0 * k * math.log(1.0 / delta_slack)) * epsilon + k * epsilon * math.expm1(
        min(epsilon, 700.0)
    )


def _optimal_composition_epsilon(
    epsilon: float, delta: float, count: int, total_delta: float
) -> float:
    """Smallest total epsilon with :func:`optimal_composition_delta` <= total_delta."""
    if -math.expm1(count * math.log1p(-delta)) >= total_delta:
        return math.inf
    hi = count * epsilon
    if optimal_composition_delta(epsilon, delta, count, 0.0) <= total_delta:
        return 0.0
    lo = 0.0
    while hi - lo > 1e-12 * hi:
        mid = 0.5 * (lo + hi)
        if optimal_composition_delta(epsilon, delta, count, mid) <= total_delta:
            hi = mid
        else:
            lo = mid
    return hi


def compose_repetitions(
    pass_epsilon: Callable[[float], float], count: int, total_delta: float
) -> tuple[float, str]:
    """Best total epsilon of ``count`` passes, each ``(pass_epsilon(d), d)``-DP for any ``d``.

    Tries a grid of per-pass deltas and, for each, basic, advanced and optimal
    composition; returns ``(epsilon, method)``. Every candidate is a valid guarantee, so
    their minimum is too. For ``count = 1`` the "optimal" candidate is the exact
    conversion of one (eps, delta) point to a smaller epsilon at a larger delta.
    """
    eps_basic = pass_epsilon(total_delta / count)
    best, method = count * eps_basic, ("basic" if count > 1 else "single pass")
    for frac in np.concatenate([np.logspace(-4, -1, 7), np.linspace(0.2, 0.9, 8)]):
        d_pass = float(frac) * total_delta / count
        eps = pass_epsilon(d_pass)
        if not math.isfinite(eps):
            continue
        slack = total_delta - count * d_pass
        adv = advanced_composition_epsilon(eps, count, slack) if count > 1 else math.inf
        if adv < best:
            best, method = adv, "advanced"
        opt = _optimal_composition_epsilon(eps, d_pass, count, total_delta)
        if opt < best:
            best, method = opt, "optimal"
    return best, method


# --------------------------------------------------------------------------- dummies
def expected_dummy_updates(
    variant: str, num_clients: int, num_slots: int, checkin_probability: float = 1.0
) -> dict[str, float]:
    """Expected number of empty slots (dummy updates, or skipped slots for ``averaged``).

    Returns ``{"expected": exact expectation, "bound": the paper's bound}``:
    fixed / averaged ``m (1 - p0/m)^n`` (Theorem 3.4; exact); sliding window
    ``(n - m + 1)(1 - 1/m)^m`` exact and ``(n - m + 1)/e`` (the paper's bound).
    ``shuffle`` has none.
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


# --------------------------------------------------------------------------- event
@dataclass(frozen=True)
class CheckinEvent(FedprivEvent):
    """One pass of a random check-in protocol with amplified central DP.

    Parameters
    ----------
    variant : {"fixed", "averaged", "sliding-window", "shuffle"}
    local_epsilon : float
        ``eps0 > 0`` of the local randomizer.
    num_clients : int
        ``n >= 1``.
    num_slots : int
        ``m >= 1`` (``m <= n`` for ``sliding-window``; ignored by ``shuffle``).
    checkin_probability : float
        ``p0`` in (0, 1]; only ``fixed`` allows ``p0 < 1``.
    local_delta : float
        ``delta0`` in [0, 1) (0: pure randomizer).
    delta1, delta2 : float, optional
        The theorems' ``delta1`` (default: smallest meeting the precondition) and Theorem
        4.1's ``delta2`` (default: optimised over a grid).

    Raises
    ------
    ConfigError
        On out-of-range values, uncovered combinations, or a failed delta0 precondition.

    Notes
    -----
    ``count`` in :meth:`epsilon` / :meth:`delta` is the number of passes (fresh check-ins).
    """

    variant: str
    local_epsilon: float
    num_clients: int
    num_slots: int = 1
    checkin_probability: float = 1.0
    local_delta: float = 0.0
    delta1: float | None = None
    delta2: float | None = None

    supported_relations: ClassVar[frozenset[str]] = frozenset({"replace_one"})

    def __post_init__(self) -> None:
        check(
            self.variant in VARIANTS,
            "variant",
            self.variant,
            "must be one of: " + ", ".join(VARIANTS),
        )
        check(
            math.isfinite(self.local_epsilon) and self.local_epsilon > 0,
            "local_epsilon",
            self.local_epsilon,
            "must be > 0",
        )
        for name in ("num_clients", "num_slots"):
            v = getattr(self, name)
            check(
                isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1,
                name,
                v,
                "must be an integer >= 1",
            )
        p = self.checkin_probability
        check(0.0 < p <= 1.0, "checkin_probability", p, "must be in (0, 1]")
        if self.variant != "fixed":
            check(
                p == 1.0,
                "checkin_probability",
                p,
                f"must be 1: {_THEOREM[self.variant]} covers only p0 = 1",
            )
        if self.variant == "sliding-window":
            check(
                self.num_slots <= self.num_clients,
                "num_slots",
                self.num_slots,
                f"must be <= num_clients={self.num_clients} for the sliding window",
            )
        check(0.0 <= self.local_delta < 1.0, "local_delta", self.local_delta, "must be in [0, 1)")
        for name in ("delta1", "delta2"):
            v = getattr(self, name)
            if v is not None:
                check(0.0 < v < 1.0, name, v, "must be in (0, 1)")
        if self.delta2 is not None:
            check(
                self.variant == "averaged",
                "delta2",
                self.delta2,
                "is only used by the averaged variant (Theorem 4.1)",
            )
        if self.local_delta > 0.0:
            if self.delta1 is not None:
                bound = delta0_bound(self.local_epsilon, self.delta1)
                check(
                    self.local_delta <= bound,
                    "local_delta",
                    self.local_delta,
                    f"violates the precondition of {_THEOREM[self.variant]}: need "
                    f"delta0 <= {bound:.4g} for local_epsilon={self.local_epsilon}, "
                    f"delta1={self.delta1}",
                )
            else:
                min_delta1(self.local_epsilon, self.local_delta)
        elif self.delta1 is not None:
            check(False, "delta1", self.delta1, "is only used when local_delta > 0")

    @property
    def theorem(self) -> str:
        """The paper's theorem behind this variant."""
        return _THEOREM[self.variant]

    def _pass(self) -> _Pass:
        return _Pass(
            self.variant,
            float(self.local_epsilon),
            int(self.num_clients),
            int(self.num_slots),
            float(self.checkin_probability),
            float(self.local_delta),
            self.delta1,
            self.delta2,
        )

    def pass_epsilon(self, target_delta: float) -> float:
        """Central epsilon of one pass at total delta ``target_delta``."""
        check(0.0 < target_delta < 1.0, "target_delta", target_delta, "must be in (0, 1)")
        return single_pass_epsilon(self._pass(), target_delta)

    def epsilon_and_method(self, target_delta: float, count: int = 1) -> tuple[float, str]:
        """``(epsilon, composition method)`` after ``count`` passes."""
        check(0.0 < target_delta < 1.0, "target_delta", target_delta, "must be in (0, 1)")
        check(int(count) == count and count >= 0, "count", count, "must be an integer >= 0")
        if count == 0:
            return 0.0, "none"
        p = self._pass()
        eps, method = compose_repetitions(
            lambda d: single_pass_epsilon(p, d), int(count), target_delta
        )
        # Every client sends at most one (ε0, δ0)-DP report per pass, and everything else the
        # server sees is independent of its data or post-processing: count·ε0 at count·δ0 is
        # always valid (basic composition), so the amplified bound never exceeds it.
        if count * self.local_delta <= target_delta and count * self.local_epsilon < eps:
            return count * float(
                self.local_epsilon
            ), "local (one report per pass, basic composition)"
        return eps, method

    def epsilon(self, target_delta: float, count: int = 1) -> float:
        """Central epsilon after ``count`` passes (``inf`` if no split is feasible)."""
        return self.epsilon_and_method(target_delta, count)[0]

    def delta(self, target_epsilon: float, count: int = 1) -> float:
        """Smallest total delta (to 1e-3 relative, rounded up) with epsilon <= target."""
        check(target_epsilon >= 0, "target_epsilon", target_epsilon, "must be >= 0")
        if count == 0:
            return 0.0

        def ok(log_d: float) -> bool:
            return self.epsilon(math.exp(log_d), count) <= target_epsilon

        hi = math.log(0.999999)
        if not ok(hi):
            return 1.0
        lo = math.log(1e-300)
        if ok(lo):
            return 1e-300
        while hi - lo > 1e-3:
            mid = 0.5 * (lo + hi)
            if ok(mid):
                hi = mid
            else:
                lo = mid
        return math.exp(hi)


# --------------------------------------------------------------------------- CLI
def run_cli(params: Mapping[str, Any]) -> dict[str, Any]:
    """CLI analysis ``checkin``.

    Keys: ``variant`` (fixed | averaged | sliding-window | shuffle), ``local_epsilon``,
    ``local_delta`` (0), ``num_clients``, ``num_slots`` (not for shuffle),
    ``checkin_probability`` (1), ``target_delta`` (or ``target_epsilon`` to get delta),
    ``delta1``, ``delta2``, ``repetitions`` (1).

    Returns
    -------
    dict
        ``epsilon``, ``delta``, ``local_epsilon``, ``theorem``, ``composition``,
        ``single_pass_epsilon``, ``expected_dummy_updates`` (and ``delta1`` when used).

    Raises
    ------
    ConfigError
        On unknown keys, bad values, uncovered combinations or a failed precondition.
    """
    p = Params(params, "checkin")
    variant = p.choice("variant", VARIANTS)
    eps0 = p.float("local_epsilon", gt=0.0)
    local_delta = p.float("local_delta", 0.0, ge=0.0, lt=1.0)
    n = p.int("num_clients", ge=1)
    m = p.int("num_slots", n if variant == "shuffle" else _REQUIRED, ge=1)
    p0 = p.float("checkin_probability", 1.0, gt=0.0, le=1.0)
    delta1 = p.float("delta1", None, gt=0.0, lt=1.0)
    delta2 = p.float("delta2", None, gt=0.0, lt=1.0)
    reps = p.int("repetitions", 1, ge=1, le=100_000)  # the optimal composition is O(repetitions)
    eps_t, delta_t = gdp.cli_targets(p)
    p.finish()
    event = CheckinEvent(variant, eps0, n, m, p0, local_delta, delta1, delta2)
    out: dict[str, Any] = {
        "analysis": "checkin",
        "variant": variant,
        "theorem": event.theorem,
        "local_epsilon": eps0,
        "local_delta": local_delta,
        "repetitions": reps,
    }
    if delta_t is not None:
        eps, method = event.epsilon_and_method(delta_t, reps)
        if not math.isfinite(eps):
            raise ConfigError(
                "target_delta",
                delta_t,
                "cannot be met: the theorem's delta terms "
                "(K (e^eps' + 1) delta1, delta2) exceed it",
            )
        out.update(
            epsilon=eps,
            delta=delta_t,
            composition=method,
            single_pass_epsilon=event.pass_epsilon(delta_t / reps),
        )
    else:
        assert eps_t is not None
        out.update(epsilon=eps_t, delta=event.delta(eps_t, reps))
    if local_delta > 0.0:
        out["delta1"] = delta1 if delta1 is not None else min_delta1(eps0, local_delta)
    out["expected_dummy_updates"] = expected_dummy_updates(variant, n, m, p0)
    if variant == "averaged":
        out["note"] = (
            "pure-eps0 form of Theorem 4.1 reconstructed from the printed (eps0, delta0) form"
        )
    return out
