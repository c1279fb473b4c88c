"""The range of a modular secure sum: how the Skellam mechanism picks its scale.

A sum modulo ``2**bits`` decodes exactly while every coordinate of the true integer sum lies in
``[-2**(bits-1), 2**(bits-1))``; a coordinate outside it *wraps*. Both the rule and the wrap
bound use ONE symmetric range, ``|c| <= R`` with ``R = 2**(bits-1) - 1``
(:func:`signed_reach`): every such ``c`` decodes, and the first values that may wrap are
``|c| = R + 1``. A wrap costs accuracy on that
coordinate, never privacy: the noise is added before the modular sum, and the release is a
function of the noised sum whatever its decoding. Two rules (:class:`ScaleRule`) pick the scale
``s`` (real units × s = integer units):

``no_wrap``
    The sum cannot wrap: ``V`` rounded vectors, each coordinate up to the vector's whole norm
    ``s C``, plus the noise's Chernoff tail. Valid without rotation; the range must hold
    ``V s C``, so the scale falls like ``1/V``.
``probabilistic``
    Kairouz, Liu, Steinke 2021 (arXiv:2102.06387, §5) and Agarwal, Kairouz, Liu 2021
    (arXiv:2110.04995, §5), as their reference implementation: after the randomized Hadamard
    rotation each coordinate of a fixed vector ``x`` is sub-Gaussian with variance proxy
    ``‖x‖²/n`` (Hoeffding), each randomized rounding adds an independent error of variance at
    most 1/4, and the noise of ``S`` steps has variance ``2 μ_S``. The range holds ``k``
    standard deviations of that coordinate::

        R = 2**(bits-1) - 1 = k sqrt(v(s)),   v(s) = s² C² G²/n + V/4 + 2 μ_S(s)

    with ``G`` the bound on the summed signal's norm in units of C (:class:`SignalGrowth`:
    ``V`` when the vectors may all point the same way, ``sqrt(V)`` for independent
    directions). At one clipped vector per client (``V`` = clients, one step) this is the
    reference's rule with ``rho = 1``. :func:`coordinate_tail_bound` states what it buys: a
    Chernoff bound on the probability that one coordinate wraps.
"""

from __future__ import annotations

import math
from enum import StrEnum

from scipy import optimize


class ScaleRule(StrEnum):
    """How the scale of an integer secure sum is chosen (see the module docstring)."""

    PROBABILISTIC = "probabilistic"
    NO_WRAP = "no_wrap"


class SignalGrowth(StrEnum):
    """Bound on the norm of the sum of ``V`` clipped vectors of norm ``C``, used by
    :attr:`ScaleRule.PROBABILISTIC`: ``linear`` (``V C``, any data: the stated wrap bound
    holds) or ``sqrt`` (``sqrt(V) C``, vectors in independent directions, as the reference's
    ``sqrtn_norm_growth``: an assumption the measured wrap count checks). Per-sample gradients
    summed over many local steps are far from independent: with ``sqrt``, a 1-epoch, 16-bit
    Fashion-MNIST run wrapped 23 % of its coordinates in round 1 (docs/secagg-experiments.md)."""

    LINEAR = "linear"
    SQRT = "sqrt"

    def norm_units(self, vectors: float) -> float:
        """``G``: the summed signal's norm bound in units of C for ``vectors`` clipped
        vectors."""
        return float(vectors) if self is SignalGrowth.LINEAR else math.sqrt(vectors)


#: k of the probabilistic rule, as the reference implementation (``k=3``).
DEFAULT_WRAP_STDDEVS = 3.0


def signed_reach(bits: int) -> int:
    """``R = 2**(bits-1) - 1``: the largest ``|c|`` for which both ``c`` and ``-c`` decode
    from a sum modulo ``2**bits`` (signed range ``[-2**(bits-1), 2**(bits-1))``).

    The probabilistic rule puts ``k`` standard deviations at most at ``R``
    (:func:`probabilistic_scale`); the wrap bound is the tail beyond ``R``, at ``R + 1``
    (:attr:`fedpriv.mechanisms.skellam_noise.SkellamMechanism.wrap_bound`).
    """
    return (1 << (bits - 1)) - 1


def probabilistic_scale(
    bits: int, wrap_stddevs: float, per_unit_variance: float, rounding_variance: float
) -> float:
    """The scale ``s`` with ``k sqrt(s² a + r) = R = 2**(bits-1) - 1`` (:func:`signed_reach`),
    or 0 if none is positive.

    Parameters
    ----------
    bits : int
        Width of the modular sum.
    wrap_stddevs : float
        k > 0.
    per_unit_variance : float
        a > 0: the coordinate's variance per unit scale² (signal and noise, ``C² (G²/n +
        S σ² N/m)``), real units squared.
    rounding_variance : float
        r >= 0: the rounding errors' variance in integer units (``V/4``).

    Returns
    -------
    float
        ``sqrt((R²/k² − r)/a)``; 0.0 if ``r`` alone fills the range.
    """
    room = float(signed_reach(bits)) ** 2 / wrap_stddevs**2 - rounding_variance
    return math.sqrt(room / per_unit_variance) if room > 0 else 0.0


def coordinate_tail_bound(
    threshold: float, subgaussian_variance: float, skellam_mu: float
) -> float:
    """Chernoff bound on ``P(X >= t)`` for ``X = Y + Sk(μ)``, ``Y`` sub-Gaussian (proxy
    ``v``) and independent of the Skellam noise.

    ``min over λ >= 0 of exp(−λ t + λ² v / 2 + 2 μ (cosh λ − 1))``: the moment generating
    functions multiply; the minimiser solves ``t = λ v + 2 μ sinh λ``.

    Parameters
    ----------
    threshold : float
        t (integer units).
    subgaussian_variance : float
        v >= 0: signal after rotation (``‖x‖²/n``) plus rounding errors (1/4 each).
    skellam_mu : float
        μ >= 0 of the summed noise ``Sk(μ)`` (variance 2μ).

    Returns
    -------
    float
        The bound, in [0, 1].
    """
    t, v, mu = float(threshold), float(subgaussian_variance), float(skellam_mu)
    if t <= 0:
        return 1.0
    if v <= 0 and mu <= 0:
        return 0.0
    upper = min(t / v if v > 0 else math.inf, math.asinh(t / (2 * mu)) if mu > 0 else math.inf)

    def slope(lam: float) -> float:
        return -t + lam * v + 2 * mu * math.sinh(lam)

    lam = optimize.brentq(slope, 0.0, upper) if slope(upper) > 0 else upper
    exponent = -lam * t + lam * lam * v / 2 + 4 * mu * math.sinh(lam / 2) ** 2  # 2μ(cosh λ−1)
    return min(1.0, math.exp(exponent))
