"""Calibration: the noise whose accounted ε just meets a target.

Bisection (in log space) on the accountant itself, so the returned noise has been *accounted*
and found ``ε <= target_epsilon``; no closed-form approximation that could overshoot.
Modelled on dp-accounting's ``mechanism_calibration``. :class:`NoiseSearch` is how a family
describes its search to :meth:`~fedpriv.accounting.core.privacy_spec.PrivacySpec.calibrated`,
which is written once, in the base.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from fedpriv.common.errors import ConfigError, check

#: Relative width of the final bracket: the result is within 0.1 % of the smallest noise.
RTOL = 1e-3
#: Search range of a noise parameter.
LOWEST, HIGHEST = 1e-6, 1e6


@dataclasses.dataclass(frozen=True, kw_only=True)
class NoiseSearch:
    """How a family's noise parameter is searched (its spec's ``noise_search`` hook).

    Parameters
    ----------
    increasing : bool
        ε INCREASES with the parameter (a local randomizer's ε0): the search returns the
        largest value meeting the target instead of the smallest.
    lowest, highest : float
        Search range; a value above ``highest`` is never evaluated (it misses the target).
    hint : (float, float), optional
        A likely bracket ``(lo, hi)`` (e.g. from a faster accountant); checked before use.
    rtol : float
        Relative width of the final bracket, in (0, 0.5).
    exact : float, optional
        The answer without a search (e.g. 0 when nothing is released at all).
    infeasible : tuple of exception types
        Errors that mean "outside the analysis' range" at a value: counted as missing the
        target (so never returned) instead of raised.
    """

    increasing: bool = False
    lowest: float = LOWEST
    highest: float = HIGHEST
    hint: tuple[float, float] | None = None
    rtol: float = RTOL
    exact: float | None = None
    infeasible: tuple[type[Exception], ...] = ()

    def solve(
        self, epsilon_of: Callable[[float], float], target_epsilon: float, field: str
    ) -> float:
        """The value :func:`bisect_noise` finds for ``epsilon_of`` (or :attr:`exact`).

        Raises
        ------
        ConfigError
            As :func:`bisect_noise`, naming ``privacy.target_epsilon`` and the parameter
            ``field``.
        """
        if self.exact is not None:
            return self.exact
        accounted = epsilon_of
        if self.infeasible:
            errors = self.infeasible

            def accounted(x: float) -> float:
                try:
                    return epsilon_of(x)
                except errors:
                    return math.inf

        return bisect_noise(
            accounted,
            target_epsilon,
            field=field,
            rtol=self.rtol,
            lowest=self.lowest,
            highest=self.highest,
            hint=self.hint,
            increasing=self.increasing,
            target_field="privacy.target_epsilon",
        )


def bisect_noise(
    epsilon_of: Callable[[float], float],
    target_epsilon: float,
    *,
    field: str = "noise_multiplier",
    start: float = 1.0,
    rtol: float = RTOL,
    lowest: float = LOWEST,
    highest: float = HIGHEST,
    hint: tuple[float, float] | None = None,
    increasing: bool = False,
    target_field: str = "target_epsilon",
) -> float:
    """Smallest noise ``x`` (to relative ``rtol``) with ``epsilon_of(x) <= target_epsilon``.

    ``epsilon_of`` must be non-increasing in the noise (non-decreasing with ``increasing``:
    then the LARGEST ``x`` meeting the target is returned). The returned value was evaluated
    and satisfies the target; ``x / (1 + rtol)`` (``x (1 + rtol)`` with ``increasing``) was
    evaluated and does not, unless the answer is at the end of the range. A value above
    ``highest`` or below ``lowest`` is never evaluated.

    Parameters
    ----------
    epsilon_of : callable
        Noise parameter -> accounted ε.
    target_epsilon : float
        Target ε, > 0.
    field : str
        Name of the noise parameter, for error messages.
    start : float
        First noise tried.
    rtol : float
        Relative width of the final bracket.
    lowest, highest : float
        Search range of the noise.
    hint : (float, float), optional
        A likely bracket ``(lo, hi)``; checked before use.
    increasing : bool
        ``epsilon_of`` increases with the parameter (search the largest value).
    target_field : str
        Name of the target, for error messages.

    Raises
    ------
    ConfigError
        If ``target_epsilon`` is not a positive finite number, or no value in the range
        reaches it.
    """
    check(
        isinstance(target_epsilon, (int, float)) and 0 < target_epsilon < math.inf,
        target_field,
        target_epsilon,
        "must be a finite number > 0",
    )
    check(0 < rtol < 0.5, "rtol", rtol, "must be in (0, 0.5)")
    if not increasing:
        why = (target_field, f"is not reachable with {field} <= {highest:g}")
        return _smallest(epsilon_of, target_epsilon, start, rtol, lowest, highest, hint, why)
    # the reflection y = 1/x turns "largest x" into "smallest y" of a non-increasing function
    why = (target_field, f"is not reachable with {field} >= {lowest:g}")
    flipped = None if hint is None else (1.0 / hint[1], 1.0 / hint[0])
    y = _smallest(
        lambda y: epsilon_of(1.0 / y),
        target_epsilon,
        1.0 / start,
        rtol,
        1.0 / highest,
        1.0 / lowest,
        flipped,
        why,
    )
    return 1.0 / y


def _smallest(
    epsilon_of: Callable[[float], float],
    target_epsilon: float,
    start: float,
    rtol: float,
    lowest: float,
    highest: float,
    hint: tuple[float, float] | None,
    why: tuple[str, str],
) -> float:
    def ok(x: float) -> bool:
        return lowest <= x <= highest and epsilon_of(x) <= target_epsilon

    lo: float | None = None
    hi: float | None = None
    if hint is not None:
        h_lo, h_hi = min(hint[0], highest), min(hint[1], highest)
        if ok(h_hi):
            hi = h_hi
            if not ok(h_lo):
                lo = h_lo
        else:
            lo = h_hi
    if hi is None:
        x = min(max(start, lo or start), highest)
        while not ok(x):
            lo = x
            if x >= highest:
                raise ConfigError(why[0], target_epsilon, why[1])
            x = min(2.0 * x, highest)
        hi = x
    while lo is None:
        x = hi / 2.0
        if x < lowest:
            return hi
        if ok(x):
            hi = x
        else:
            lo = x
    while hi / lo > 1.0 + rtol:
        mid = math.sqrt(lo * hi)
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


#: A coarse search (1 %): a bracket for a slower accountant's search from a faster one's answer.
COARSE_SEARCH = NoiseSearch(rtol=0.01)
