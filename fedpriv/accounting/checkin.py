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
  ``eps = e^{3 eps0} (e^eps0 - 1)^2 / (2n) + e^{3 eps0 / 2} (e^eps0 - 1) sqrt(2 L / n)``,
  and the numerical bound of Feldman, McMillan, Talwar (:mod:`fedpriv.accounting.shuffle`);
  the smaller (each composed over the passes) is reported, both are shown.

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
(arXiv:2007.06605), Theorems 3.2, 4.1, 4.3, 5.1, Corollary 3.3, Theorem 3.4 (dummy updates)
and the sliding-window dummy bound.
Feldman, McMillan, Talwar, "Hiding Among the Clones: A Simple and Nearly Optimal Analysis of
Privacy Amplification by Shuffling" (arXiv:2012.12803), Appendix E (pure ``eps0`` only).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

import numpy as np
import scipy.special
import scipy.stats

from fedpriv.accounting import gdp, shuffle
from fedpriv.accounting.ledger import FedprivEvent
from fedpriv.accounting.params import Params
from fedpriv.accounting.vocabulary import Accountant, Conversion, NeighboringRelation
from fedpriv.accounting.accountant import AccountingSpec
from fedpriv.common.validate import check_finite, check_positive, parse_enum
from fedpriv.common.errors import ConfigError, check
from fedpriv.mechanisms.randomizers import LocalRandomizer, RandomizerKind

__all__ = [
    "CheckinVariant",
    "VARIANTS",
    "LOCAL_CAP",
    "CheckinBound",
    "PoissonLocalEvent",
    "LocalCapEvent",
    "CheckinSpec",
    "pure_epsilon",
    "delta0_bound",
    "min_delta1",
    "single_pass_epsilon",
    "compose_repetitions",
    "COMPOSITION_FRACTIONS",
    "optimal_composition_delta",
    "advanced_composition_epsilon",
    "expected_dummy_updates",
    "CheckinEvent",
    "run_cli",
]


class CheckinVariant(StrEnum):
    """The check-in protocols (and their theorems).

    ``fixed`` (Algorithm 1, Theorem 3.2), ``averaged`` (Algorithm 2, Theorem 4.1),
    ``sliding-window`` (Section 4.2, Theorem 4.3), ``poisson`` (server-side Poisson sampling
    of clients, the baseline: :class:`PoissonLocalEvent`) and ``shuffle`` (Theorem 5.1 and,
    for pure ``eps0``, the FMT21 numerical bound: shuffling of ``n`` local reports; an
    analysis of ``fedpriv-account`` only, no run).
    A closed set: each member names the analysis that accounts it.
    """

    FIXED = "fixed"
    AVERAGED = "averaged"
    SLIDING_WINDOW = "sliding-window"
    POISSON = "poisson"
    SHUFFLE = "shuffle"


#: The variants a check-in theorem accounts (:class:`CheckinEvent`).
VARIANTS = (
    CheckinVariant.FIXED,
    CheckinVariant.AVERAGED,
    CheckinVariant.SLIDING_WINDOW,
    CheckinVariant.SHUFFLE,
)
#: The variants a run executes (:class:`CheckinSpec` with ``run=True``).
RUN_VARIANTS = (
    CheckinVariant.FIXED,
    CheckinVariant.AVERAGED,
    CheckinVariant.SLIDING_WINDOW,
    CheckinVariant.POISSON,
)
_THEOREM = {
    CheckinVariant.FIXED: "Theorem 3.2",
    CheckinVariant.AVERAGED: "Theorem 4.1",
    CheckinVariant.SLIDING_WINDOW: "Theorem 4.3",
    CheckinVariant.SHUFFLE: "Theorem 5.1",
}
#: The name of the trivial bound: each client sends at most one report per pass.
LOCAL_CAP = "local eps0 cap"
_CAP_COMPOSITION = "local (one report per pass, basic composition)"


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
    (identical in Theorems 3.2, 4.1, 4.3, 5.1), evaluated in log space: for a huge ``eps0``
    it underflows to 0 (no ``delta0 > 0`` qualifies) instead of overflowing or dividing by 0.
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


#: Fractions of ``total_delta / count`` tried as the per-pass delta by :func:`compose_repetitions`.
COMPOSITION_FRACTIONS = tuple(
    float(f) for f in np.concatenate([np.logspace(-4, -1, 7), np.linspace(0.2, 0.9, 8)])
)
#: A coarser grid for expensive per-pass bounds (the FMT21 numerical shuffling bound).
_FMT_FRACTIONS = (1e-3, 1e-2, 0.1, 0.3, 0.6, 0.9)


def compose_repetitions(
    pass_epsilon: Callable[[float], float],
    count: int,
    total_delta: float,
    fractions: tuple[float, ...] = COMPOSITION_FRACTIONS,
) -> tuple[float, str]:
    """Best total epsilon of ``count`` passes, each ``(pass_epsilon(d), d)``-DP for any ``d``.

    Tries a grid of per-pass deltas and, for each, basic, advanced and optimal
    composition; returns ``(epsilon, method)``. Every candidate is a valid guarantee, so
    their minimum is too. For ``count = 1`` the "optimal" candidate is the exact
    conversion of one (eps, delta) point to a smaller epsilon at a larger delta.
    ``fractions``: the per-pass deltas tried, as fractions of ``total_delta / count`` (besides
    ``total_delta / count`` itself, for basic composition).
    """
    eps_basic = pass_epsilon(total_delta / count)
    best, method = count * eps_basic, ("basic" if count > 1 else "single pass")
    for frac in fractions:
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
class CheckinBound:
    """Which bound answered for a check-in epsilon, and why the theorem did not (if so).

    Attributes
    ----------
    epsilon : float
        The central epsilon (``inf`` when nothing holds at the requested delta).
    bound : str
        The theorem (``"Theorem 4.1"``), :data:`LOCAL_CAP`, or the Poisson baseline's mixture.
    composition : str
        How passes were composed (``basic``, ``advanced``, ``optimal``, ``single pass``).
    reason : str or None
        Why the theorem did not answer; ``None`` when it did.
    by_bound : tuple of (str, float)
        Every bound that was evaluated and its composed epsilon (``shuffle`` with a pure
        randomizer: Theorem 5.1 and :data:`fedpriv.accounting.shuffle.FMT_NUMERICAL`);
        empty otherwise.
    """

    epsilon: float
    bound: str
    composition: str
    reason: str | None = None
    by_bound: tuple[tuple[str, float], ...] = ()

    def summary(self) -> dict[str, Any]:
        """``{"bound", "composition", ["bound_reason"], ["epsilon_by_bound"]}`` (results, CLI)."""
        out: dict[str, Any] = {"bound": self.bound, "composition": self.composition}
        if self.reason is not None:
            out["bound_reason"] = self.reason
        if self.by_bound:
            out["epsilon_by_bound"] = dict(self.by_bound)
        return out


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
        variant = parse_enum(CheckinVariant, "variant", self.variant)
        check(
            variant in VARIANTS,
            "variant",
            str(self.variant),
            "must be one of: "
            + ", ".join(VARIANTS)
            + " (poisson is accounted by PoissonLocalEvent)",
        )
        object.__setattr__(self, "variant", variant)
        check(
            math.isfinite(self.local_epsilon) and self.local_epsilon > 0,
            "local_epsilon",
            self.local_epsilon,
            "must be > 0",
        )
        for name in ("num_clients", "num_slots"):
            v = getattr(self, name)
            check(
                bool(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1),
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
                f"must be 1: {_THEOREM[CheckinVariant(self.variant)]} covers only p0 = 1",
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
                    f"violates the precondition of {_THEOREM[CheckinVariant(self.variant)]}: need "
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
        return _THEOREM[CheckinVariant(self.variant)]

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

    def bound(self, target_delta: float, count: int = 1) -> CheckinBound:
        """The central epsilon after ``count`` passes, and which bound gives it, and why.

        The theorem's bound (composed over passes) is compared with the local cap: every
        client sends at most one (``eps0``, ``delta0``)-DP report per pass and everything
        else the server sees is independent of its data or post-processing, so ``count eps0``
        at ``count delta0`` always holds (basic composition). The smaller answers; when the
        cap answers, :attr:`CheckinBound.reason` says why the theorem did not.

        ``shuffle`` with a pure randomizer (``local_delta = 0``): the numerical bound of
        Feldman, McMillan, Talwar (arXiv:2012.12803; :func:`fedpriv.accounting.shuffle.
        shuffle_epsilon`), composed over the passes the same way, is a second valid
        per-pass guarantee; the smaller of it and Theorem 5.1 answers (``bound`` names it)
        and both are in :attr:`CheckinBound.by_bound`.

        Returns
        -------
        CheckinBound
            ``epsilon`` (``inf`` if neither bound holds at ``target_delta``).
        """
        return self._bound(target_delta, count, fmt=True)

    def _bound(self, target_delta: float, count: int, fmt: bool) -> CheckinBound:
        """:meth:`bound`; ``fmt=False`` leaves the FMT21 numerical bound out."""
        check(0.0 < target_delta < 1.0, "target_delta", target_delta, "must be in (0, 1)")
        check(int(count) == count and count >= 0, "count", count, "must be an integer >= 0")
        if count == 0:
            return CheckinBound(0.0, self.theorem, "none")
        p = self._pass()
        eps, method = compose_repetitions(
            lambda d: single_pass_epsilon(p, d), int(count), target_delta
        )
        name = self.theorem
        by_bound: tuple[tuple[str, float], ...] = ()
        if fmt and self.uses_fmt:
            eps_fmt, method_fmt = self._fmt_composed(target_delta, int(count))
            by_bound = ((self.theorem, eps), (shuffle.FMT_NUMERICAL, eps_fmt))
            if eps_fmt < eps:
                eps, method, name = eps_fmt, method_fmt, shuffle.FMT_NUMERICAL
        cap = count * float(self.local_epsilon)
        cap_holds = count * self.local_delta <= target_delta
        if cap_holds and cap < eps:
            return CheckinBound(
                cap,
                LOCAL_CAP,
                _CAP_COMPOSITION,
                self._why_not(target_delta, count, eps, name),
                by_bound,
            )
        if not math.isfinite(eps):
            why = self._why_not(target_delta, count, eps)
            return CheckinBound(
                math.inf,
                self.theorem,
                method,
                f"{why}; the local cap needs repetitions x local_delta = "
                f"{count * self.local_delta:.3g} <= target_delta",
                by_bound,
            )
        return CheckinBound(eps, name, method, None, by_bound)

    @property
    def uses_fmt(self) -> bool:
        """Whether the FMT21 numerical shuffling bound applies (``shuffle``, pure ``eps0``)."""
        return self.variant == "shuffle" and self.local_delta == 0.0

    def fmt_pass_epsilon(self, target_delta: float) -> float:
        """FMT21 numerical central epsilon of one pass (``shuffle``, pure ``eps0`` only).

        Raises
        ------
        ConfigError
            ``variant`` when the bound does not apply (another variant, or
            ``local_delta > 0``: the reference code covers pure randomizers only).
        """
        check(
            self.uses_fmt,
            "variant",
            f"{self.variant}, local_delta={self.local_delta}",
            "must be shuffle with local_delta=0 for the FMT21 numerical bound",
        )
        check(0.0 < target_delta < 1.0, "target_delta", target_delta, "must be in (0, 1)")
        return shuffle.shuffle_epsilon(
            int(self.num_clients), float(self.local_epsilon), float(target_delta)
        )

    def _fmt_composed(self, target_delta: float, count: int) -> tuple[float, str]:
        """FMT21 numerical epsilon composed over ``count`` passes (as the theorem's)."""
        if count == 1:  # the bound is the whole delta(eps) curve: no conversion to try
            return self.fmt_pass_epsilon(target_delta), "single pass"
        return compose_repetitions(self.fmt_pass_epsilon, count, target_delta, _FMT_FRACTIONS)

    def _why_not(self, target_delta: float, count: int, eps: float, name: str | None = None) -> str:
        """Why the theorem's bound did not answer at ``target_delta`` after ``count`` passes."""
        th = self.theorem if name is None else name
        if math.isfinite(eps):
            return f"{th} gives {eps:.6g} > {count} x eps0 = {count * self.local_epsilon:.6g}"
        if self.variant is CheckinVariant.AVERAGED and self.delta2 is not None:
            if count * self.delta2 >= target_delta:
                what = "delta2" if count == 1 else f"{count} x delta2"
                return (
                    f"{th} needs target_delta > {what} = {count * self.delta2:.6g} "
                    f"(got target_delta={target_delta:.6g}; its total delta is delta + delta2)"
                )
        e_eff = self.local_epsilon if self.local_delta == 0.0 else 8.0 * self.local_epsilon
        probe = pure_epsilon(
            self.variant,
            e_eff,
            self.num_clients,
            self.num_slots,
            target_delta / (2 * count),
            self.checkin_probability,
            self.delta2 if self.delta2 is not None else target_delta / (2 * count),
        )
        if not math.isfinite(probe):
            return f"{th}'s bound overflows a double at local_epsilon={self.local_epsilon:g}"
        if self.local_delta > 0.0:
            return (
                f"{th}'s delta terms K (e^eps' + 1) delta1 leave no room in "
                f"target_delta={target_delta:.6g}"
            )
        return f"{th} has no finite bound at target_delta={target_delta:.6g}"

    def epsilon_and_method(self, target_delta: float, count: int = 1) -> tuple[float, str]:
        """``(epsilon, composition method)`` after ``count`` passes (see :meth:`bound`)."""
        b = self.bound(target_delta, count)
        return b.epsilon, b.composition

    def epsilon(self, target_delta: float, count: int = 1) -> float:
        """Central epsilon after ``count`` passes (``inf`` if no split is feasible)."""
        return self.epsilon_and_method(target_delta, count)[0]

    def delta(self, target_epsilon: float, count: int = 1) -> float:
        """Smallest total delta (to 1e-3 relative, rounded up) with epsilon <= target.

        ``shuffle`` with a pure randomizer: the smaller of the delta of Theorem 5.1 (or the
        local cap) and that of the FMT21 numerical bound (its delta at ``target_epsilon``,
        :func:`fedpriv.accounting.shuffle.shuffle_delta`; several passes: basic composition,
        ``count delta(target_epsilon / count)``, valid but possibly above what
        :meth:`epsilon` composes optimally).
        """
        check(target_epsilon >= 0, "target_epsilon", target_epsilon, "must be >= 0")
        if count == 0:
            return 0.0
        best = _smallest_delta(lambda d: self._bound(d, count, fmt=False).epsilon, target_epsilon)
        if self.uses_fmt:
            if count == 1:
                d_fmt = shuffle.shuffle_delta(
                    int(self.num_clients), float(self.local_epsilon), float(target_epsilon)
                )
            else:  # basic composition of the curve: count x delta(eps / count)
                d_fmt = count * shuffle.shuffle_delta(
                    int(self.num_clients),
                    float(self.local_epsilon),
                    float(target_epsilon) / count,
                )
            best = min(best, d_fmt)
        return best


def _smallest_delta(epsilon_at: Callable[[float], float], target_epsilon: float) -> float:
    """Smallest delta in [1e-300, 1) (1e-3 relative, rounded up) with epsilon_at <= target."""

    def ok(log_d: float) -> bool:
        return epsilon_at(math.exp(log_d)) <= target_epsilon

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


# --------------------------------------------------------------------------- poisson baseline
@dataclass(frozen=True)
class PoissonLocalEvent(FedprivEvent):
    """``steps`` model steps, each averaging the local reports of Poisson-sampled clients.

    The server samples each client at rate ``q = sample_rate`` per step and releases the mean
    of the sampled clients' randomized reports. Unlike a check-in slot (which always carries
    exactly one report, a dummy when empty), the number of reports is not fixed, so the
    target's participation may be visible: the worst case reveals it. Over ``T = count *
    steps`` steps the target reports ``K ~ Binomial(T, q)`` times (independently of its
    data) and, given ``K = k``, the release is the ``k``-fold composition of the randomizer:

    ``delta(eps) = sum_k P(K = k) delta_k(eps)`` (the mixture with its component revealed),
    with ``delta_k`` the optimal composition of ``k`` pure ``eps0``-DP
    mechanisms (Kairouz, Oh, Viswanath 2015, Theorem 3.3; ``mu is None``) or exactly
    ``delta_{G_{sqrt(k) mu}}(eps)`` for the Gaussian randomizer with ``mu = 2L / sigma``.
    The Binomial tail beyond ``k_max`` (at most ``1e-3 target_delta``) is charged to delta.
    Given ``K <= k_max`` reports the pure release is ``k_max eps0``-DP, so the search for
    epsilon is bounded by ``k_max eps0`` and never overflows for a huge ``eps0``.

    Raises
    ------
    ConfigError
        On out-of-range fields.
    """

    local_epsilon: float
    sample_rate: float
    steps: int
    mu: float | None = None

    supported_relations: ClassVar[frozenset[str]] = frozenset({"replace_one"})

    def __post_init__(self) -> None:
        check_positive("privacy.local_epsilon", self.local_epsilon, "must be > 0")
        check(
            0 < self.sample_rate <= 1,
            "client.client_sample_rate",
            self.sample_rate,
            "must be in (0, 1]",
        )
        check(
            int(self.steps) == self.steps and self.steps >= 1,
            "steps",
            self.steps,
            "must be an integer >= 1",
        )
        check(self.mu is None or self.mu > 0, "mu", self.mu, "must be > 0 or None")

    def _delta_k(self, k: int, eps: float) -> float:
        if self.mu is not None:
            return float(gdp.gdp_delta(eps, math.sqrt(k) * self.mu))
        return optimal_composition_delta(self.local_epsilon, 0.0, k, eps)

    def _mixture(self, count: int, target_delta: float) -> tuple[np.ndarray, np.ndarray, float]:
        total = int(count) * int(self.steps)
        kmax = min(
            total, int(scipy.stats.binom.isf(1e-3 * target_delta, total, self.sample_rate)) + 1
        )
        ks = np.arange(1, kmax + 1)
        return (
            ks,
            scipy.stats.binom.pmf(ks, total, self.sample_rate),
            float(scipy.stats.binom.sf(kmax, total, self.sample_rate)),
        )

    def _delta_at(self, eps: float, ks: np.ndarray, w: np.ndarray, tail: float) -> float:
        return tail + float(
            sum(wk * self._delta_k(int(k), eps) for k, wk in zip(ks, w, strict=True) if wk > 0)
        )

    def epsilon(self, target_delta: float, count: int = 1) -> float:
        check(0 < target_delta < 1, "target_delta", target_delta, "must be in (0, 1)")
        if count == 0:
            return 0.0
        ks, w, tail = self._mixture(count, target_delta)
        if self._delta_at(0.0, ks, w, tail) <= target_delta:
            return 0.0
        hi = 1.0
        limit = max(1e4, 4.0 * float(ks[-1]) * self.local_epsilon)
        while self._delta_at(hi, ks, w, tail) > target_delta:
            hi *= 2.0
            if hi > limit:
                return math.inf
        lo = 0.0
        while hi - lo > 1e-9 * max(hi, 1.0):
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if self._delta_at(mid, ks, w, tail) <= target_delta else (mid, hi)
        return hi

    def delta(self, target_epsilon: float, count: int = 1) -> float:
        check(target_epsilon >= 0, "target_epsilon", target_epsilon, "must be >= 0")
        if count == 0:
            return 0.0
        ks, w, tail = self._mixture(count, 1e-12)
        return min(1.0, self._delta_at(target_epsilon, ks, w, tail))


@dataclass(frozen=True)
class LocalCapEvent(FedprivEvent):
    """A pass accounted by the local cap alone: the theorem's precondition fails.

    Every client sends at most one (``local_epsilon``, ``local_delta``)-DP report per pass and
    the rest of the server's view is independent of its data, so ``count`` passes are
    ``(count eps0, count delta0)``-DP (basic composition). Used when the (eps0, delta0)
    precondition of the check-in theorems holds for no ``delta1 < 1`` (e.g. a huge ``eps0``).

    Parameters
    ----------
    local_epsilon, local_delta : float
        ``eps0 > 0`` and ``delta0`` in [0, 1).
    reason : str
        Why the theorem does not apply (reported with the epsilon).

    Raises
    ------
    NotImplementedError
        From :meth:`epsilon` when ``count delta0 > target_delta`` (no bound holds).
    """

    local_epsilon: float
    local_delta: float
    reason: str = ""

    supported_relations: ClassVar[frozenset[str]] = frozenset({"replace_one"})

    def __post_init__(self) -> None:
        check_positive("privacy.local_epsilon", self.local_epsilon, "must be > 0")
        d0 = check_finite("privacy.local_delta", self.local_delta, "must be in [0, 1)")
        check(0 <= d0 < 1, "privacy.local_delta", self.local_delta, "must be in [0, 1)")

    def bound(self, target_delta: float, count: int = 1) -> CheckinBound:
        """``count eps0`` if ``count delta0 <= target_delta``, else ``inf`` (with the reason)."""
        if count == 0:
            return CheckinBound(0.0, LOCAL_CAP, "none", self.reason)
        if count * self.local_delta > target_delta:
            return CheckinBound(
                math.inf,
                LOCAL_CAP,
                _CAP_COMPOSITION,
                f"{self.reason}; the local cap needs repetitions x local_delta = "
                f"{count * self.local_delta:.3g} <= target_delta={target_delta:.3g}",
            )
        return CheckinBound(
            count * float(self.local_epsilon), LOCAL_CAP, _CAP_COMPOSITION, self.reason
        )

    def epsilon(self, target_delta: float, count: int = 1) -> float:
        b = self.bound(target_delta, count)
        if not math.isfinite(b.epsilon):
            raise NotImplementedError(b.reason)
        return b.epsilon

    def delta(self, target_epsilon: float, count: int = 1) -> float:
        if count == 0:
            return 0.0
        return count * self.local_delta if target_epsilon >= count * self.local_epsilon else 1.0


# --------------------------------------------------------------------------- the spec
_PREFIX = {
    "variant": "client.",
    "num_slots": "client.",
    "window": "client.",
    "randomizer": "client.",
    "client_sample_rate": "client.",
    "local_epsilon": "privacy.",
    "local_delta": "privacy.",
    "checkin_probability": "privacy.",
    "clipping_norm": "privacy.",
    "delta1": "privacy.",
    "delta2": "privacy.",
    "target_delta": "privacy.",
}


def _prefixed(exc: ConfigError) -> ConfigError:
    """``exc`` with the config group added to a bare field name (``privacy.local_delta``)."""
    name = exc.field if "." in exc.field else _PREFIX.get(exc.field, "") + exc.field
    return ConfigError(name, exc.value, exc.allowed)


def _bare(exc: ConfigError) -> ConfigError:
    """``exc`` with the config group removed (the CLI's key names)."""
    group, _, rest = exc.field.partition(".")
    name = rest if rest and group in ("privacy", "client") else exc.field
    return ConfigError(name, exc.value, exc.allowed)


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


@dataclass(frozen=True, kw_only=True)
class CheckinSpec:
    """One random check-in mechanism: validation, events, epsilon, calibration, CLI.

    Built by both :class:`clients.checkin_clients.CheckinClient` (from its fields and the run's
    ``privacy`` group, :meth:`from_privacy`) and ``fedpriv-account checkin``
    (:meth:`from_params`), so the CLI prints exactly the run's epsilon.

    Parameters
    ----------
    variant : CheckinVariant
        The protocol (``shuffle`` only for the CLI: ``run=True`` refuses it).
    local_epsilon : float
        ``eps0 > 0`` of the local randomizer (finite).
    num_clients : int
        ``n >= 1``.
    num_slots : int
        ``m >= 1``: slots of a pass (model steps of ``poisson``), or the sliding window's
        length (``m <= n``); ``shuffle`` ignores it.
    local_delta : float
        ``delta0``: 0 for the laplace randomizer, in (0, 1) for the gaussian one.
    checkin_probability : float
        ``p0`` in (0, 1]; only ``fixed`` allows ``p0 < 1``.
    window : (int, int) or None
        ``R_j`` for ``fixed`` / ``averaged``; only ``(1, m)`` is covered by the theorems.
    randomizer : RandomizerKind
        The local randomizer (:class:`fedpriv.mechanisms.randomizers.LocalRandomizer`).
    clipping_norm : float
        ``L > 0`` (l2 or l1 by the randomizer).
    client_sample_rate : float or None
        ``poisson`` only: the server's per-step sampling rate ``q`` (default ``p0 / m``).
    delta1, delta2 : float or None
        The theorems' ``delta1`` and Theorem 4.1's ``delta2`` (default: optimised).
    accounting : AccountingSpec
        ``target_delta`` at which epsilon is reported; the check-in analyses give (epsilon,
        delta) directly, so ``accountant`` and ``conversion`` are recorded but do not change
        the answer (the ledger reports ``... (own analysis)``). The relation is replace-one.
    run : bool
        True when a run executes it (``shuffle`` refused).

    Raises
    ------
    ConfigError
        One line naming the field (``client.variant``, ``privacy.local_epsilon``, ...) for a
        non-finite or out-of-range value, an uncovered combination, or a (eps0, delta0)
        precondition that fails while the local cap cannot hold either.

    References
    ----------
    Balle, Bell, Gascon, Kairouz, Thakurta, "Privacy Amplification via Random Check-Ins"
    (arXiv:2007.06605), Theorems 3.2, 4.1, 4.3, 5.1 and Corollary 3.3.
    """

    variant: CheckinVariant
    local_epsilon: float
    num_clients: int
    num_slots: int
    local_delta: float = 0.0
    checkin_probability: float = 1.0
    window: tuple[int, int] | None = None
    randomizer: RandomizerKind = RandomizerKind.LAPLACE
    clipping_norm: float = 1.0
    client_sample_rate: float | None = None
    delta1: float | None = None
    delta2: float | None = None
    accounting: AccountingSpec = field(
        default_factory=lambda: AccountingSpec(neighboring_relation=NeighboringRelation.REPLACE_ONE)
    )
    run: bool = True

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        variant = parse_enum(CheckinVariant, "client.variant", self.variant)
        if self.run:
            check(
                variant in RUN_VARIANTS,
                "client.variant",
                variant.value,
                "must be one of: "
                + ", ".join(RUN_VARIANTS)
                + " (shuffle is an analysis of fedpriv-account only)",
            )
        set_(self, "variant", variant)
        set_(self, "randomizer", parse_enum(RandomizerKind, "client.randomizer", self.randomizer))
        for name in ("local_epsilon", "local_delta", "checkin_probability", "clipping_norm"):
            set_(self, name, check_finite(f"privacy.{name}", getattr(self, name)))
        for name in ("client_sample_rate", "delta1", "delta2"):
            if getattr(self, name) is not None:
                set_(self, name, check_finite(_PREFIX[name] + name, getattr(self, name)))
        check(self.local_epsilon > 0, "privacy.local_epsilon", self.local_epsilon, "must be > 0")
        for name in ("num_slots", "num_clients"):
            v = getattr(self, name)
            check(_is_int(v) and v >= 1, _PREFIX.get(name, "") + name, v, "must be an integer >= 1")
            set_(self, name, int(v))
        p0 = self.checkin_probability
        check(0.0 < p0 <= 1.0, "privacy.checkin_probability", p0, "must be in (0, 1]")
        if variant is CheckinVariant.SLIDING_WINDOW:
            check(
                self.num_slots <= self.num_clients,
                "client.num_slots",
                self.num_slots,
                f"must be <= num_clients={self.num_clients} for the sliding window "
                "(window of m slots, n - m + 1 updates)",
            )
        if self.window is not None:
            self._check_window()
        if self.client_sample_rate is not None:
            check(
                variant is CheckinVariant.POISSON,
                "client.client_sample_rate",
                self.client_sample_rate,
                "is only used by client.variant=poisson",
            )
        acc = self.accounting
        if acc.neighboring_relation is not NeighboringRelation.REPLACE_ONE:
            acc = dataclasses.replace(acc, neighboring_relation=NeighboringRelation.REPLACE_ONE)
            set_(self, "accounting", acc)
        _ = self.local_randomizer  # validates the randomizer's fields
        event = self.pass_event()
        if isinstance(event, LocalCapEvent):
            why = event.reason.split(f"local_delta={self.local_delta!r} ", 1)[-1]
            check(
                self.local_delta <= acc.target_delta,
                "privacy.local_delta",
                self.local_delta,
                f"{why} ({self.theorem}), and the local cap needs local_delta <= "
                f"target_delta={acc.target_delta:g}",
            )

    def _check_window(self) -> None:
        """``window`` must be ``[1, m]`` (the only window Theorems 3.2 / 4.1 cover)."""
        w = list(self.window or [])
        check(
            self.variant in (CheckinVariant.FIXED, CheckinVariant.AVERAGED),
            "client.window",
            w,
            f"must be null for client.variant={self.variant.value} (the sliding window's "
            "R_j = {j..j+m-1} is set by num_slots)",
        )
        check(
            len(w) == 2 and all(_is_int(v) for v in w) and w[0] <= w[1],
            "client.window",
            w,
            "must be [first, last] slot numbers",
        )
        check(
            1 <= w[0] and w[1] <= self.num_slots,
            "client.window",
            w,
            f"lies outside the run's slots [1, {self.num_slots}]",
        )
        check(
            w == [1, self.num_slots],
            "client.window",
            w,
            f"must be the whole run [1, {self.num_slots}]: the check-in theorems cover only "
            "R_j = [m]",
        )
        object.__setattr__(self, "window", (int(w[0]), int(w[1])))

    # -- construction ------------------------------------------------------------------
    @classmethod
    def from_privacy(
        cls, privacy: Mapping[str, Any], *, num_clients: int, **client: Any
    ) -> CheckinSpec:
        """From a run's ``privacy`` group and the client fields (``variant``, ``num_slots``,
        ``randomizer``, ``window``, ``client_sample_rate``).

        Raises
        ------
        ConfigError
            As the constructor; ``privacy.local_epsilon`` when it is missing.
        """
        eps0 = privacy.get("local_epsilon")
        check(
            eps0 is not None,
            "privacy.local_epsilon",
            eps0,
            "must be set (> 0) for check-in clients",
        )
        window = client.pop("window", None)
        return cls(
            local_epsilon=check_finite("privacy.local_epsilon", eps0, "must be > 0"),
            local_delta=privacy.get("local_delta") or 0.0,
            clipping_norm=privacy.get("clipping_norm", 1.0),
            checkin_probability=privacy.get("checkin_probability", 1.0),
            delta1=privacy.get("delta1"),
            delta2=privacy.get("delta2"),
            window=None if window is None else tuple(window),
            num_clients=num_clients,
            accounting=AccountingSpec.from_privacy(
                dict(privacy), neighboring_relation=NeighboringRelation.REPLACE_ONE
            ),
            **client,
        )

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> tuple[CheckinSpec, dict[str, Any]]:
        """The spec of ``fedpriv-account checkin key=value ...`` and the query.

        Keys: ``variant``, ``local_epsilon`` (omit it, with ``target_epsilon`` and
        ``target_delta``, to calibrate it), ``local_delta`` (0), ``num_clients``,
        ``num_slots`` (not for shuffle), ``checkin_probability`` (1), ``randomizer``
        (default ``gaussian`` when ``local_delta > 0``, else ``laplace``), ``clipping_norm``
        (1), ``client_sample_rate`` (poisson), ``delta1``, ``delta2``, ``repetitions`` (the
        run's ``num_rounds``, 1), ``target_delta`` and/or ``target_epsilon``,
        ``accountant``, ``conversion``.

        Returns
        -------
        (CheckinSpec, dict)
            The spec and ``{"repetitions", "target_epsilon", "target_delta", "calibrate"}``.

        Raises
        ------
        ConfigError
            Naming the CLI key (no ``privacy.`` prefix).
        """
        p = Params(params, "checkin")
        variant = parse_enum(CheckinVariant, "variant", p.str("variant"))
        calibrate = not p.has("local_epsilon")
        eps0 = p.float("local_epsilon", None, gt=0.0)
        local_delta = p.float("local_delta", 0.0, ge=0.0, lt=1.0)
        n = p.int("num_clients", ge=1)
        m = p.int("num_slots", n if variant is CheckinVariant.SHUFFLE else None, ge=1)
        if m is None:
            raise ConfigError("num_slots", None, "is required")
        p0 = p.float("checkin_probability", 1.0, gt=0.0, le=1.0)
        randomizer = p.str("randomizer", "gaussian" if local_delta > 0 else "laplace")
        clip = p.float("clipping_norm", 1.0, gt=0.0)
        rate = p.float("client_sample_rate", None, gt=0.0, le=1.0)
        delta1 = p.float("delta1", None, gt=0.0, lt=1.0)
        delta2 = p.float("delta2", None, gt=0.0, lt=1.0)
        reps = p.int("repetitions", 1, ge=1, le=100_000)  # optimal composition is O(reps)
        accountant = p.str("accountant", "pld")
        conversion = p.str("conversion", "default")
        eps_t, delta_t = gdp.cli_targets(p)
        p.finish()
        if calibrate:
            check(
                eps_t is not None and delta_t is not None,
                "local_epsilon",
                None,
                "is required (or give target_epsilon and target_delta to calibrate it)",
            )
        try:
            spec = cls(
                variant=variant,
                local_epsilon=1.0 if eps0 is None else eps0,
                local_delta=local_delta,
                num_clients=n,
                num_slots=m,
                checkin_probability=p0,
                randomizer=parse_enum(RandomizerKind, "randomizer", randomizer),
                clipping_norm=clip,
                client_sample_rate=rate,
                delta1=delta1,
                delta2=delta2,
                accounting=AccountingSpec(
                    accountant=parse_enum(Accountant, "accountant", accountant),
                    conversion=parse_enum(Conversion, "conversion", conversion),
                    target_delta=delta_t if delta_t is not None else 1e-5,
                    neighboring_relation=NeighboringRelation.REPLACE_ONE,
                ),
                run=False,
            )
            spec.check_passes(reps)
        except ConfigError as exc:
            raise _bare(exc) from None
        query = {
            "repetitions": reps,
            "target_epsilon": eps_t,
            "target_delta": delta_t,
            "calibrate": calibrate,
        }
        return spec, query

    # -- the mechanism -------------------------------------------------------------------
    @property
    def theorem(self) -> str:
        """The analysis behind the variant (``Theorem 3.2``, ..., or the Poisson mixture)."""
        if self.variant is CheckinVariant.POISSON:
            return "Poisson mixture of local releases"
        return _THEOREM[CheckinVariant(self.variant)]

    @property
    def local_randomizer(self) -> LocalRandomizer:
        """The clients' (and dummies') :class:`~fedpriv.mechanisms.randomizers.LocalRandomizer`."""
        return LocalRandomizer(
            self.randomizer, self.clipping_norm, self.local_epsilon, self.local_delta
        )

    @property
    def sample_rate(self) -> float:
        """``poisson``: the per-step client sampling rate ``q`` (default ``p0 / m``)."""
        if self.client_sample_rate is not None:
            return float(self.client_sample_rate)
        return self.checkin_probability / self.num_slots

    @property
    def steps(self) -> int:
        """Model-update slots per pass (``n - m + 1`` for the sliding window)."""
        if self.variant is CheckinVariant.SLIDING_WINDOW:
            return self.num_clients - self.num_slots + 1
        return self.num_slots

    @property
    def normalizer(self) -> float:
        """The public constant dividing a client's release: 1.

        A client sends ``A_ldp(clip(g))``: its clipped gradient plus noise calibrated to the
        clipping norm, divided by nothing (no data size). The server's means (over a
        slot's check-ins, over a block's slots) divide reports that are each ``eps0``-LDP on
        their own by counts that do not depend on any client's data: post-processing of
        the reports the theorem accounts.
        """
        return 1.0

    def pass_event(self) -> FedprivEvent:
        """The central event of one pass (:class:`CheckinEvent`, :class:`PoissonLocalEvent`,
        or :class:`LocalCapEvent` when the (eps0, delta0) precondition fails)."""
        if self.variant is CheckinVariant.POISSON:
            r = self.local_randomizer
            mu = r.sensitivity / r.noise_stddev if r.kind is RandomizerKind.GAUSSIAN else None
            return PoissonLocalEvent(self.local_epsilon, self.sample_rate, self.num_slots, mu)
        try:
            return CheckinEvent(
                self.variant,
                self.local_epsilon,
                self.num_clients,
                self.num_slots,
                self.checkin_probability,
                self.local_delta,
                self.delta1,
                self.delta2,
            )
        except ConfigError as exc:
            if exc.field == "local_delta" and self.delta1 is None and "every delta1" in exc.allowed:
                return LocalCapEvent(
                    self.local_epsilon,
                    self.local_delta,
                    reason=f"{self.theorem}: local_delta={self.local_delta!r} {exc.allowed}",
                )
            raise _prefixed(exc) from None

    def round_events(self) -> list[tuple[Any, int]]:
        """One pass (fresh check-ins) per server round: ``[(pass_event, 1)]``."""
        return [(self.pass_event(), 1)]

    def local_events(self) -> list[tuple[Any, int]]:
        """A client sends at most one randomized report per pass."""
        return [(self.local_randomizer.local_event(), 1)]

    def check_passes(self, passes: int) -> None:
        """Refuse ``passes`` for which no bound holds at the target delta (local cap only).

        Raises
        ------
        ConfigError
            ``num_rounds`` when the pass event is a :class:`LocalCapEvent` and
            ``passes x local_delta > target_delta``.
        """
        event = self.pass_event()
        if isinstance(event, LocalCapEvent):
            check(
                passes * self.local_delta <= self.accounting.target_delta,
                "num_rounds",
                passes,
                f"is too many: {event.reason}, and the local cap needs num_rounds x "
                f"local_delta <= target_delta={self.accounting.target_delta:g}",
            )

    def bound(self, passes: int, target_delta: float | None = None) -> CheckinBound:
        """Epsilon after ``passes`` passes with the bound that gives it (and why)."""
        delta = self.accounting.target_delta if target_delta is None else target_delta
        event = self.pass_event()
        if isinstance(event, (CheckinEvent, LocalCapEvent)):
            return event.bound(delta, passes)
        eps = event.epsilon(delta, passes)
        return CheckinBound(eps, self.theorem, "mixture over the number of reports")

    def epsilon(self, passes: int, target_delta: float | None = None) -> float:
        """Central epsilon after ``passes`` passes, composed through the run's ledger."""
        acc = self.accounting
        if target_delta is not None:
            acc = dataclasses.replace(acc, target_delta=target_delta)
        return acc.epsilon([(self.pass_event(), passes)]) if passes else 0.0

    def summary(self, passes: int | None = None) -> dict[str, Any]:
        """The ``privacy`` block of ``results.json`` (and the CLI's details)."""
        r = self.local_randomizer
        out: dict[str, Any] = {
            "normalizer": self.normalizer,
            "variant": self.variant.value,
            "randomizer": r.kind.value,
            "local_epsilon": self.local_epsilon,
            "local_delta": self.local_delta,
            "noise_stddev": r.noise_stddev,
            "sensitivity": r.sensitivity,
            "theorem": self.theorem,
        }
        if passes:
            out.update(self.bound(passes).summary())
        return out

    def calibrated(
        self, target_epsilon: float, target_delta: float, num_rounds: int
    ) -> CheckinSpec:
        """A copy whose ``local_epsilon`` is the largest with central epsilon <= target.

        Bisection (60 geometric steps) on ``eps0`` of the epsilon the run's ledger reports
        after ``num_rounds`` passes at ``target_delta``; the epsilon is continuous and
        increasing in ``eps0``, so the result is within 1% of the target.

        Raises
        ------
        ConfigError
            ``privacy.target_epsilon`` when it is not finite and > 0, or when even
            ``eps0 = 1e-6`` misses it.
        """
        target = check_finite(
            "privacy.target_epsilon", target_epsilon, "must be a finite number > 0"
        )
        check(target > 0, "privacy.target_epsilon", target_epsilon, "must be > 0")
        acc = dataclasses.replace(self.accounting, target_delta=target_delta)

        def spec_at(e0: float) -> CheckinSpec:
            return dataclasses.replace(self, local_epsilon=e0, accounting=acc)

        def eps_at(e0: float) -> float:
            try:
                return spec_at(e0).epsilon(num_rounds)
            except (ConfigError, NotImplementedError):
                return math.inf

        lo, hi = 1e-6, 1.0
        check(
            eps_at(lo) <= target,
            "privacy.target_epsilon",
            target_epsilon,
            f"cannot be met even with local_epsilon={lo}",
        )
        while eps_at(hi) <= target:
            lo, hi = hi, 2 * hi
            if hi > 1e6:
                break
        for _ in range(60):
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if eps_at(mid) <= target else (lo, mid)
        return spec_at(lo)


# --------------------------------------------------------------------------- CLI
def run_cli(params: Mapping[str, Any]) -> dict[str, Any]:
    """CLI analysis ``checkin`` (keys: :meth:`CheckinSpec.from_params`).

    ``noise``: ``local`` (default, the keys below) or ``central_gaussian``: the slots
    release clients' clipped sums plus one central Gaussian, and
    :func:`fedpriv.accounting.checkin_gaussian.run_cli` answers (its keys).

    Returns
    -------
    dict
        ``epsilon``, ``delta``, ``local_epsilon``, ``theorem``, ``bound`` (which bound
        answered), ``bound_reason`` (why the theorem did not, when it did not),
        ``epsilon_by_bound`` (``shuffle``, pure ``eps0``: Theorem 5.1's and the FMT21
        numerical epsilon, each composed over the repetitions),
        ``composition``, ``expected_dummy_updates``, the spec's summary (``normalizer``,
        noise) and ``delta1`` when used; with ``calibrated = local_epsilon`` when calibrated.

    Raises
    ------
    ConfigError
        On unknown keys, bad values, uncovered combinations or a failed precondition.
    NotImplementedError
        When no bound holds at the requested delta (one line).
    """
    from fedpriv.accounting import checkin_gaussian

    noise = params.get("noise", checkin_gaussian.CheckinNoise.LOCAL.value)
    kind = parse_enum(checkin_gaussian.CheckinNoise, "noise", noise)
    if kind is checkin_gaussian.CheckinNoise.CENTRAL_GAUSSIAN:  # central noise: own analysis
        return checkin_gaussian.run_cli(params)
    params = {k: v for k, v in params.items() if k != "noise"}
    spec, q = CheckinSpec.from_params(params)
    reps, eps_t, delta_t = q["repetitions"], q["target_epsilon"], q["target_delta"]
    out: dict[str, Any] = {"analysis": "checkin"}
    if q["calibrate"]:
        try:
            spec = spec.calibrated(eps_t, delta_t, reps)
        except ConfigError as exc:
            raise _bare(exc) from None
        out.update(calibrated="local_epsilon", target_epsilon=eps_t)
    out.update(
        variant=spec.variant.value,
        theorem=spec.theorem,
        local_epsilon=spec.local_epsilon,
        local_delta=spec.local_delta,
        repetitions=reps,
    )
    if delta_t is not None:
        b = spec.bound(reps, delta_t)
        if not math.isfinite(b.epsilon):
            raise ConfigError(
                "target_delta",
                delta_t,
                f"cannot be met: {b.reason or 'no bound is finite'}",
            )
        eps = spec.epsilon(reps, delta_t)
        out.update(epsilon=eps, delta=delta_t, **b.summary())
    else:
        assert eps_t is not None
        out.update(epsilon=eps_t, delta=spec.pass_event().delta(eps_t, reps))
    out.update({k: v for k, v in spec.summary().items() if k not in out})
    if spec.local_delta > 0.0 and spec.variant is not CheckinVariant.POISSON:
        if spec.delta1 is not None:
            out["delta1"] = spec.delta1
        elif isinstance(spec.pass_event(), CheckinEvent):
            out["delta1"] = min_delta1(spec.local_epsilon, spec.local_delta)
    if spec.variant is not CheckinVariant.POISSON:
        out["expected_dummy_updates"] = expected_dummy_updates(
            spec.variant, spec.num_clients, spec.num_slots, spec.checkin_probability
        )
    if spec.variant is CheckinVariant.AVERAGED:
        out["note"] = (
            "pure-eps0 form of Theorem 4.1 reconstructed from the printed (eps0, delta0) form"
        )
    return out
