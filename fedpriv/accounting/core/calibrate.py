"""Calibration: the smallest noise whose accounted ε is at most a target.

Bisection (in log space) on the accountant itself, so the returned noise has been *accounted*
and found ``ε <= target_epsilon``; no closed-form approximation that could overshoot.
Modelled on dp-accounting's ``mechanism_calibration``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from fedpriv.common.errors import ConfigError, check

#: Relative width of the final bracket: the result is within 0.1 % of the smallest noise.
RTOL = 1e-3


def bisect_noise(
    epsilon_of: Callable[[float], float],
    target_epsilon: float,
    *,
    field: str = "noise_multiplier",
    start: float = 1.0,
    rtol: float = RTOL,
    lowest: float = 1e-6,
    highest: float = 1e6,
    hint: tuple[float, float] | None = None,
) -> float:
    """Smallest noise ``x`` (to relative ``rtol``) with ``epsilon_of(x) <= target_epsilon``.

    ``epsilon_of`` must be non-increasing in the noise. The returned value was evaluated and
    satisfies the target; ``x / (1 + rtol)`` was evaluated and does not (unless the answer is
    ``lowest``: then even the least noise tried meets the target).

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

    Raises
    ------
    ConfigError
        If ``target_epsilon`` is not a positive finite number, or even ``highest`` noise does
        not reach it.
    """
    check(
        isinstance(target_epsilon, (int, float)) and 0 < target_epsilon < math.inf,
        "target_epsilon",
        target_epsilon,
        "must be a finite number > 0",
    )
    check(0 < rtol < 0.5, "rtol", rtol, "must be in (0, 0.5)")

    def ok(x: float) -> bool:
        return epsilon_of(x) <= target_epsilon

    lo: float | None = None
    hi: float | None = None
    if hint is not None:
        h_lo, h_hi = hint
        if ok(h_hi):
            hi = h_hi
            if not ok(h_lo):
                lo = h_lo
        else:
            lo = h_hi
    if hi is None:
        x = max(start, lo or start)
        while not ok(x):
            lo = x
            x *= 2.0
            if x > highest:
                raise ConfigError(
                    "target_epsilon",
                    target_epsilon,
                    f"is not reachable with {field} <= {highest:g}",
                )
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
