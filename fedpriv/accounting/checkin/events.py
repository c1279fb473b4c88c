"""The ledger events of random check-ins with local randomizers, and the bound that answers.

* :class:`CheckinEvent` -- one pass of a check-in protocol, amplified central DP (the paper's
  theorems, :mod:`fedpriv.accounting.samplers.checkin`, composed over passes by
  :mod:`fedpriv.accounting.accountants.composition`; for ``shuffle`` with a pure randomizer also
  the numerical bound of Feldman, McMillan, Talwar, :mod:`fedpriv.accounting.samplers.shuffle`); the
  smaller of the theorem and the local cap answers (:class:`CheckinBound` says which, and why).
* :class:`PoissonLocalEvent` -- the server-sampled baseline: a mixture over the number of
  reports.
* :class:`LocalCapEvent` -- a pass accounted by the local cap alone (a failed (eps0, delta0)
  precondition).

References
----------
Balle, Bell, Gascon, Kairouz, Thakurta, "Privacy Amplification via Random Check-Ins"
(arXiv:2007.06605), Theorems 3.2, 4.1, 4.3, 5.1, Corollary 3.3.
Feldman, McMillan, Talwar, "Hiding Among the Clones: A Simple and Nearly Optimal Analysis of
Privacy Amplification by Shuffling" (arXiv:2012.12803), Appendix E (pure ``eps0`` only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import scipy.stats

from fedpriv.accounting.accountants import gdp
from fedpriv.accounting.accountants.composition import (
    FMT_FRACTIONS,
    compose_repetitions,
    optimal_composition_delta,
    smallest_delta,
)
from fedpriv.accounting.core.event import FedprivEvent
from fedpriv.accounting.samplers import shuffle
from fedpriv.accounting.samplers.checkin import (
    THEOREMS,
    VARIANTS,
    PassParams,
    delta0_bound,
    min_delta1,
    pure_epsilon,
    single_pass_epsilon,
)
from fedpriv.common.errors import check
from fedpriv.common.validate import check_finite, check_positive, parse_enum
from fedpriv.mechanisms.checkin_draw import CheckinVariant

__all__ = [
    "LOCAL_CAP",
    "CheckinBound",
    "CheckinEvent",
    "PoissonLocalEvent",
    "LocalCapEvent",
]

#: The name of the trivial bound: each client sends at most one report per pass.
LOCAL_CAP = "local eps0 cap"
_CAP_COMPOSITION = "local (one report per pass, basic composition)"


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
        randomizer: Theorem 5.1 and :data:`fedpriv.accounting.samplers.shuffle.FMT_NUMERICAL`);
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
                f"must be 1: {THEOREMS[CheckinVariant(self.variant)]} covers only p0 = 1",
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
                    f"violates the precondition of {THEOREMS[CheckinVariant(self.variant)]}: need "
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
        return THEOREMS[CheckinVariant(self.variant)]

    def _pass(self) -> PassParams:
        return PassParams(
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
        Feldman, McMillan, Talwar (arXiv:2012.12803; :func:`fedpriv.accounting.samplers.shuffle.
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
        return compose_repetitions(self.fmt_pass_epsilon, count, target_delta, FMT_FRACTIONS)

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
        :func:`fedpriv.accounting.samplers.shuffle.shuffle_delta`; several passes: basic
        composition,
        ``count delta(target_epsilon / count)``, valid but possibly above what
        :meth:`epsilon` composes optimally).
        """
        check(target_epsilon >= 0, "target_epsilon", target_epsilon, "must be >= 0")
        if count == 0:
            return 0.0
        best = smallest_delta(lambda d: self._bound(d, count, fmt=False).epsilon, target_epsilon)
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


@dataclass(frozen=True)
class PoissonLocalEvent(FedprivEvent):
    """``steps`` model steps, each averaging the local reports of Poisson-sampled clients.

    The server samples each client at rate ``q = slot_sample_rate`` per slot (step) and
    releases the mean of the sampled clients' randomized reports. Unlike a check-in slot
    (which always carries exactly one report, a dummy when empty), the number of reports is
    not fixed, so the target's participation may be visible: the worst case reveals it. Over
    ``T = count * steps`` steps the target reports ``K ~ Binomial(T, q)`` times
    (independently of its data) and, given ``K = k``, the release is the ``k``-fold
    composition of the randomizer:

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
    slot_sample_rate: float
    steps: int
    mu: float | None = None

    supported_relations: ClassVar[frozenset[str]] = frozenset({"replace_one"})

    def __post_init__(self) -> None:
        check_positive("privacy.local_epsilon", self.local_epsilon, "must be > 0")
        check(
            0 < self.slot_sample_rate <= 1,
            "client.slot_sample_rate",
            self.slot_sample_rate,
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
            total, int(scipy.stats.binom.isf(1e-3 * target_delta, total, self.slot_sample_rate)) + 1
        )
        ks = np.arange(1, kmax + 1)
        return (
            ks,
            scipy.stats.binom.pmf(ks, total, self.slot_sample_rate),
            float(scipy.stats.binom.sf(kmax, total, self.slot_sample_rate)),
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
