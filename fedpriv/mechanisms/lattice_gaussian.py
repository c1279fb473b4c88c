"""Discrete Gaussian noise on a fine lattice: the Gaussian path of ``privacy.secure_mode``.

A float Gaussian sample added to a float vector leaks the vector through the low-order bits of
the result (Mironov 2012, "On Significance of the Least Significant Bits for Differential
Privacy"): the set of floats a sum can take depends on the input. Here the input is rounded to
the lattice ``γℤ^d`` and integer noise is added: the output ``γ (round(x/γ) + K)`` with ``K``
discrete-Gaussian, so the output is always a point of ``γℤ^d`` and every point has positive
probability, for every input: neighbouring inputs share their support. ``γ`` is a power of
two, so ``γ · integer`` is an exact float for ``|integer| < 2^53``.

Sensitivity: rounding moves each coordinate by at most ``γ/2``, so two inputs at ℓ2 distance
``Δ`` round to lattice points at distance at most ``Δ + γ√d``. With ``γ = Δ 2^-B / √d``
(rounded down to a power of two) the noise multiplier to account is ``z / (1 + 2^-B)``:
:func:`lattice_noise_multiplier`.

Privacy: the discrete Gaussian ``N_ℤ(0, s²)`` per coordinate with ℓ2 sensitivity ``Δ`` (in
lattice units) is ``Δ²/(2s²)``-zCDP, i.e. RDP ``α Δ²/(2s²)``, the continuous Gaussian's curve
(Canonne, Kamath, Steinke 2020, "The Discrete Gaussian for Differential Privacy",
arXiv:2004.00010, Theorem 4 and, for vectors, Theorem 15); Poisson subsampling by the general
RDP amplification bound (Steinke 2022, arXiv:2210.00597), as for Skellam:
:class:`fedpriv.accounting.loss_models.discrete_gaussian.DiscreteGaussianEvent`.

Sampler: CKS20 Algorithm 3 (discrete-Laplace proposals of scale ``t = ⌊s⌋ + 1``, accepted with
probability ``exp(-(|Y| - s²/t)² / (2 s²))``), vectorized with numpy. Proposals and
acceptance use numpy's geometric and uniform draws (53-bit floats), so the pmf is the discrete
Gaussian's up to a relative error of order 1e-15 per draw; the support is exact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from fedpriv.common.errors import check

#: Lattice resolution: γ = Δ · 2^-LATTICE_BITS / √d (rounded down to a power of two).
LATTICE_BITS = 20


def lattice_step(sensitivity: float, dim: int) -> float:
    """γ: the largest power of two <= ``sensitivity · 2^-LATTICE_BITS / √dim``.

    Raises
    ------
    ConfigError
        For a non-positive sensitivity or dimension.
    """
    check(sensitivity > 0, "sensitivity", sensitivity, "must be > 0")
    check(dim >= 1, "dim", dim, "must be >= 1")
    return 2.0 ** math.floor(math.log2(sensitivity * 2.0**-LATTICE_BITS / math.sqrt(dim)))


def lattice_noise_multiplier(noise_multiplier: float) -> float:
    """The noise multiplier to account for lattice noise of std ``noise_multiplier · Δ``:
    the rounding grows the sensitivity to at most ``Δ (1 + 2^-LATTICE_BITS)``."""
    return float(noise_multiplier) / (1.0 + 2.0**-LATTICE_BITS)


def sample_discrete_gaussian(
    sigma: float, shape: tuple[int, ...], rng: np.random.Generator
) -> np.ndarray:
    """i.i.d. discrete Gaussian ``N_ℤ(0, sigma²)`` integers (int64, ``shape``), CKS20 Alg. 3.

    Raises
    ------
    ConfigError
        If ``sigma`` is not in (0, 2^40] (beyond it int64 proposals could overflow).
    """
    check(0 < sigma <= 2.0**40, "sigma", sigma, "must be in (0, 2^40] lattice units")
    t = math.floor(sigma) + 1
    p = -math.expm1(-1.0 / t)  # geometric success probability 1 - e^{-1/t}
    n = int(np.prod(shape, dtype=np.int64))
    out = np.empty(n, dtype=np.int64)
    todo = np.arange(n)
    while todo.size:
        y = rng.geometric(p, todo.size) - rng.geometric(p, todo.size)  # discrete Laplace(t)
        excess = np.abs(y).astype(np.float64) - sigma * sigma / t
        accept = rng.random(todo.size) < np.exp(-(excess * excess) / (2 * sigma * sigma))
        out[todo[accept]] = y[accept]
        todo = todo[~accept]
    return out.reshape(shape)


def add_lattice_gaussian(
    arrays: Mapping[str, np.ndarray], stddev: float, step: float, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """``γ (round(x/γ) + K)`` per array, ``K ~ N_ℤ(0, (stddev/γ)²)``; float64, shapes kept.

    Parameters
    ----------
    arrays : mapping of str to np.ndarray
        The exact (e.g. summed) values; any shapes.
    stddev : float
        Noise standard deviation in the arrays' units (> 0).
    step : float
        γ, a power of two (:func:`lattice_step`).
    rng : np.random.Generator
        The noise generator (OS-entropy seeded in secure mode).

    Raises
    ------
    ConfigError
        If ``step`` is not a positive power of two, or a value is beyond ``2^52 γ``.
    """
    check(step > 0 and math.frexp(step)[0] == 0.5, "step", step, "must be a power of two")
    out = {}
    for key in sorted(arrays):
        scaled = np.asarray(arrays[key], dtype=np.float64) / step
        check(bool(np.all(np.abs(scaled) < 2.0**52)), key, "values", "exceed 2^52 lattice steps")
        k = np.rint(scaled).astype(np.int64) + sample_discrete_gaussian(
            stddev / step, scaled.shape, rng
        )
        out[key] = k.astype(np.float64) * step
    return out
