"""Group privacy of an (ε, δ) guarantee: from one record to groups of g records.

If a mechanism M is (ε, δ)-DP for datasets at distance 1 (here: replace one record), then for
datasets at distance g (replace g records: a path of g replace-one steps) it is
(g ε, g e^{(g−1) ε} δ)-DP. Proof by induction on g: with δ_g the group-g slack,
δ_g ≤ e^ε δ_{g−1} + δ, so δ_g ≤ δ Σ_{i<g} e^{iε} ≤ g e^{(g−1)ε} δ.

Applied to a whole privacy profile δ₁(ε) of the g = 1 analysis, every ε₁ >= 0 gives a valid
pair (g ε₁, g e^{(g−1)ε₁} δ₁(ε₁)); :func:`group_privacy_epsilon` returns the smallest g ε₁
found whose δ meets the target (any returned value satisfies it; bisection finds the crossing).

References
----------
Dwork, Roth, "The Algorithmic Foundations of Differential Privacy" (2014), Theorem 2.2 (group
privacy, pure ε); Vadhan, "The Complexity of Differential Privacy" (2017), Lemma 2.2 (group
privacy for (ε, δ)); hypotheses: the g = 1 profile holds for every pair of neighbours, and
neighbours at distance g are joined by g neighbour steps (true for replace-one).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from fedpriv.common.errors import check

#: Relative width of the bisection on ε₁ (the returned ε always meets the δ target).
GROUP_RTOL = 1e-6
#: Above this ε₁ the lemma is useless here: ``inf`` is returned.
GROUP_EPSILON_CAP = 1e4
#: The scanned grid of ε₁: geometric from this value to the cap (steps of about 10 %).
GROUP_SCAN_START = 1e-4
GROUP_SCAN_POINTS = 200
#: The smallest δ₁ the lemma trusts (dp-accounting's FFT composition is accurate to ~1e-14 in
#: δ; at δ = 1e-14 it answered 3.029 for an exact 3.013-3.015).
DELTA_RESOLUTION = 1e-11


def group_privacy_delta(
    delta_of: Callable[[float], float], group_privacy: int, target_epsilon: float
) -> float:
    """δ of groups of ``g`` at ``target_epsilon``: ``g e^{(g−1)ε/g} δ₁(ε/g)`` (capped at 1).

    Parameters
    ----------
    delta_of : callable
        ε₁ -> δ₁(ε₁), the g = 1 privacy profile (valid for every pair of neighbours).
    group_privacy : int
        g >= 1.
    target_epsilon : float
        ε >= 0 of the group guarantee.

    References
    ----------
    Vadhan 2017, Lemma 2.2; Dwork, Roth 2014, Theorem 2.2. Hypotheses: ``delta_of`` holds for
    every pair of neighbours of the replace-one relation, and datasets differing in ``g``
    records are joined by ``g`` replace-one steps.
    """
    g = _check_group(group_privacy)
    eps1 = float(target_epsilon) / g
    delta1 = float(delta_of(eps1))
    if g == 1:
        return min(1.0, delta1)
    # δ₁ comes from FFT-composed PLDs, accurate to ~1e-14 in δ, and the lemma multiplies it by
    # g e^{(g−1)ε₁}: δ₁ is used no smaller than DELTA_RESOLUTION (still an upper bound on it).
    delta1 = max(delta1, DELTA_RESOLUTION)
    log_delta = math.log(g) + (g - 1) * eps1 + math.log(delta1)  # no overflow at large ε₁
    return 1.0 if log_delta >= 0.0 else math.exp(log_delta)


def group_privacy_epsilon(
    delta_of: Callable[[float], float], group_privacy: int, target_delta: float
) -> float:
    """Smallest ``g ε₁`` (to :data:`GROUP_RTOL`, first found on a geometric scan) with
    ``g e^{(g−1)ε₁} δ₁(ε₁) <= target_delta``;
    ``inf`` when no ε₁ <= :data:`GROUP_EPSILON_CAP` meets it.

    The returned value was evaluated and meets the target, so it is a valid ε for groups of
    ``g`` whatever the shape of δ₁.

    Parameters
    ----------
    delta_of : callable
        ε₁ -> δ₁(ε₁), the g = 1 privacy profile.
    group_privacy : int
        g >= 1.
    target_delta : float
        δ in (0, 1).

    Raises
    ------
    ConfigError
        For g < 1 or δ outside (0, 1).

    References
    ----------
    Vadhan 2017, Lemma 2.2; Dwork, Roth 2014, Theorem 2.2. Hypotheses: ``delta_of`` holds for
    every pair of neighbours of the replace-one relation, and datasets differing in ``g``
    records are joined by ``g`` replace-one steps.
    """
    g = _check_group(group_privacy)
    check(0 < target_delta < 1, "target_delta", target_delta, "must be in (0, 1)")

    def ok(eps1: float) -> bool:
        return group_privacy_delta(delta_of, g, g * eps1) <= target_delta

    if ok(0.0):
        return 0.0
    # g e^{(g-1) ε₁} δ₁(ε₁) need not fall monotonically in ε₁: scan a geometric grid for the
    # first ε₁ that meets δ, then bisect below it (only evaluated, feasible values return).
    grid = np.geomspace(GROUP_SCAN_START, GROUP_EPSILON_CAP, GROUP_SCAN_POINTS)
    first = next((k for k, eps1 in enumerate(grid) if ok(float(eps1))), None)
    if first is None:
        return math.inf
    lo, hi = (float(grid[first - 1]) if first else 0.0), float(grid[first])
    while hi - lo > GROUP_RTOL * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return g * hi


def _check_group(group_privacy: int) -> int:
    check(
        isinstance(group_privacy, int)
        and not isinstance(group_privacy, bool)
        and group_privacy >= 1,
        "group_privacy",
        group_privacy,
        "must be an integer >= 1",
    )
    return group_privacy
