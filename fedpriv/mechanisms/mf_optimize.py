"""Optimisers for matrix-factorization (DP-FTRL) strategies of the prefix-sum workload.

The workload is A (n x n, lower-triangular ones): the n prefix sums of the clipped, summed
updates. A strategy C (lower triangular, A = B C with B = A C^-1) is scored by the standard
objective of the field, the squared error of the prefix sums for the noise that achieves
sensitivity 1:

    loss(C) = sens(C)^2 * ||A C^-1||_F^2 / n          (``error="mean"``: the RMSE^2)
    loss(C) = sens(C)^2 * max_t ||(A C^-1)[t]||^2      (``error="max"``: the last prefix sum)

per unit noise multiplier and clipping norm. Everything is float64 on CPU.

- :func:`optimize_banded_toeplitz`: a banded Toeplitz C (BandMF with Toeplitz structure),
  L-BFGS on its ``bands`` coefficients, the loss in O(n * bands) from the first column of
  C^-1 (McKenna 2024, Sec. 4).
- :func:`optimize_blt`: a buffered-linear-Toeplitz C (BLT), L-BFGS on its decays and scales,
  the loss in O(n log n) from the rational generating function of C (Dvijotham et al. 2024;
  McMahan et al. 2024).
- :func:`optimize_dense`: the optimal dense C for n <= 2000: single participation by the
  fixed-point iteration on the dual of ``min tr(A^T A X^-1) s.t. diag(X) = 1`` (Denisov et al.
  2022); b-min-separation (and cyclic Poisson) by L-BFGS over b-banded, column-normalised C
  (Choquette-Choo et al. 2023, BandMF).
- :func:`cached`: any of the three, stored on disk as ``.npz`` (no pickle) under a key that is
  the sha256 of the inputs and :data:`SOLVER_VERSION`.

Sensitivity. Single participation: the largest column norm of C (for Toeplitz C: the norm of
the coefficient vector). b-min-separation with k participations: for a b-banded C (columns b
or more apart are orthogonal) or a Toeplitz C with non-negative, non-increasing coefficients,
the worst case is k participations exactly b apart from round 1 (Kalinin, Lampert,
arXiv:2405.13763, Thm. 2); this is the bound optimised and checked here.
Cyclic Poisson is optimised as b-min-separation with k = ceil(n / b) (the un-amplified bound).

References
----------
Denisov, McMahan, Rush, Smith, Thakurta, "Improved Differential Privacy for SGD via Optimal
Private Linear Operators on Adaptive Streams" (arXiv:2202.08312).
Choquette-Choo, McMahan, Rush, Thakurta, "Multi-Epoch Matrix Factorization Mechanisms for
Private Machine Learning" (arXiv:2211.06530).
Choquette-Choo, Ganesh, McKenna, McMahan, Rush, Thakurta, Xu, "(Amplified) Banded Matrix
Factorization: A unified approach to private training" (arXiv:2306.08153).
Dvijotham, McMahan, Pillutla, Steinke, Thakurta, "Efficient and Near-Optimal Noise Generation
for Streaming Differential Privacy" (arXiv:2404.16706).
McKenna, "Scaling up the Banded Matrix Factorization Mechanism for Differentially Private ML"
(arXiv:2405.15913).
McMahan, Xu, Zhang, "A Hassle-free Algorithm for Private Learning in Practice: Don't Use Tree
Aggregation, Use BLTs" (arXiv:2408.08868): BLT optimisation from the Toeplitz coefficients,
min-separation loss.
Kalinin, Lampert, "Banded Square Root Matrix Factorization for Differentially Private Model
Training" (arXiv:2405.13763): min-separation sensitivity of decreasing Toeplitz strategies.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import linalg, optimize, signal

from fedpriv.common.errors import check
from fedpriv.mechanisms.participation import Participation, ParticipationKind

#: Part of every cache key: bump it when a solver's output for the same inputs changes.
SOLVER_VERSION = "mf_optimize/1"

#: The largest n :func:`optimize_dense` accepts (an n x n eigendecomposition per step).
MAX_DENSE_ROUNDS = 2000

_ERRORS = ("mean", "max")
Array = np.ndarray


# ---------------------------------------------------------------------------------------------
# Solutions
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToeplitzSolution:
    """A banded Toeplitz strategy: C[i, j] = coefficients[i - j] for 0 <= i - j < bands.

    ``coefficients`` are scaled to unit norm (the largest column norm of C is 1); ``loss`` is
    the objective (module docstring) of that C; ``seconds`` the wall time of the optimisation
    (for a cache hit: of the run that computed it).
    """

    num_rounds: int
    coefficients: tuple[float, ...]
    loss: float
    seconds: float
    error: str = "mean"
    iterations: int = 0
    from_cache: bool = False


@dataclass(frozen=True)
class BLTSolution:
    """A buffered-linear-Toeplitz strategy: C Toeplitz with c_0 = 1 and
    c_i = sum_j output_scales[j] * buffer_decays[j] ** (i - 1) for i >= 1 (decays in
    decreasing order)."""

    num_rounds: int
    buffer_decays: tuple[float, ...]
    output_scales: tuple[float, ...]
    loss: float
    seconds: float
    error: str = "mean"
    iterations: int = 0
    from_cache: bool = False


@dataclass(frozen=True)
class DenseSolution:
    """A dense lower-triangular strategy C (``matrix``) with Gram matrix X = C^T C
    (``gram``, unit diagonal: every column of C has norm 1). ``gap`` bounds how far ``loss`` is
    from the optimum (duality gap of the single-participation solver; NaN otherwise)."""

    num_rounds: int
    matrix: np.ndarray
    gram: np.ndarray
    loss: float
    seconds: float
    gap: float = float("nan")
    iterations: int = 0
    from_cache: bool = False


Solution = ToeplitzSolution | BLTSolution | DenseSolution


# ---------------------------------------------------------------------------------------------
# Participation
# ---------------------------------------------------------------------------------------------


def participation_bounds(participation: Participation | None, num_rounds: int) -> tuple[int, int]:
    """(k, b): the most participations of one client in ``num_rounds`` rounds and the least
    separation between two of them (``None`` or ``single``: (1, n))."""
    n = int(num_rounds)
    if participation is None or participation.kind is ParticipationKind.SINGLE:
        return 1, n
    k = participation.max_participations_in(n)
    b = participation.separation
    return (1, n) if k <= 1 else (k, b)


# ---------------------------------------------------------------------------------------------
# Toeplitz algebra (first columns of lower-triangular Toeplitz matrices)
# ---------------------------------------------------------------------------------------------


def _impulse(n: int) -> Array:
    e = np.zeros(n)
    e[0] = 1.0
    return e


def toeplitz_inverse_coefs(coefficients: Any, num_rounds: int) -> Array:
    """First column of C^-1 (length n) for the lower-triangular Toeplitz C with first column
    ``coefficients`` (zero-padded or truncated to n): the recursion
    h_t = -(sum_{j>=1} c_j h_{t-j}) / c_0, O(n * len(coefficients))."""
    c = np.asarray(coefficients, dtype=np.float64)[:num_rounds]
    return np.asarray(signal.lfilter([1.0], c, _impulse(num_rounds)))


def _error_weights(n: int, error: str) -> Array:
    check(error in _ERRORS, "error", error, "must be 'mean' or 'max'")
    return (n - np.arange(n)) / n if error == "mean" else np.ones(n)


def toeplitz_error(inverse_coefs: Array, error: str = "mean") -> float:
    """``||A C^-1||_F^2 / n`` (mean) or the last row's squared norm (max) from the first
    column h of C^-1: A C^-1 is lower-triangular Toeplitz with first column cumsum(h), whose
    entry t appears in n - t rows."""
    h = np.asarray(inverse_coefs, dtype=np.float64)
    s = np.cumsum(h)
    return float(_error_weights(h.size, error) @ (s * s))


def _error_and_grad_h(h: Array, error: str) -> tuple[float, Array]:
    s = np.cumsum(h)
    w = _error_weights(h.size, error)
    g_s = 2.0 * w * s
    return float(w @ (s * s)), np.cumsum(g_s[::-1])[::-1]


def _grad_coefs_from_grad_h(
    h: Array, g_h: Array, solve_t: Callable[[Array], Array], m: int
) -> Array:
    """d(err)/d c_j for j < m given d(err)/dh, with h = C^-1 e_0 and ``solve_t`` solving
    C^T w = g: d h = -C^-1 (dC) h, so d err/d c_j = -sum_t w_t h_{t-j}."""
    n = h.size
    w = solve_t(g_h)
    if not (np.all(np.isfinite(w)) and np.all(np.isfinite(h))):
        return np.full(m, np.nan)
    conv = signal.convolve(w[::-1], h)  # conv[n-1-j] = sum_u w_{u+j} h_u
    return np.asarray(-conv[n - 1 - np.arange(m)])


def minsep_sensitivity_squared(coefficients: Any, num_rounds: int, k: int, b: int) -> float:
    """sens^2 of the Toeplitz C for k participations at least b apart: ||sum_{m<k} C e_{mb}||^2
    (exact when C is b-banded or its coefficients are non-negative and non-increasing;
    arXiv:2405.13763 Thm. 2). k = 1: the squared norm of the coefficients."""
    value, _ = _sens_and_grad(
        np.asarray(coefficients, dtype=np.float64)[:num_rounds], num_rounds, k, b
    )
    return value


def _sens_and_grad(c: Array, n: int, k: int, b: int) -> tuple[float, Array]:
    m = c.size
    if k <= 1:
        return float(c @ c), 2.0 * c
    v = np.zeros(n)
    for p in range(k):
        start = p * b
        if start >= n:
            break
        length = min(m, n - start)
        v[start : start + length] += c[:length]
    grad = np.zeros(m)
    for p in range(k):
        start = p * b
        if start >= n:
            break
        length = min(m, n - start)
        grad[:length] += 2.0 * v[start : start + length]
    return float(v @ v), grad


def _check_minsep_valid(c: Array, k: int, b: int) -> None:
    """The k-participation bound holds for b-banded C or non-negative non-increasing c."""
    if k <= 1 or c.size <= b:
        return
    ok = bool(np.all(c >= -1e-12) and np.all(np.diff(c) <= 1e-12))
    if not ok:
        raise RuntimeError(
            "optimised Toeplitz coefficients are not non-negative and non-increasing: the "
            f"min-separation sensitivity bound (k={k}, b={b}) does not apply"
        )


def toeplitz_loss(
    coefficients: Any,
    num_rounds: int,
    participation: Participation | None = None,
    error: str = "mean",
) -> float:
    """The objective (module docstring) of the lower-triangular Toeplitz C with first column
    ``coefficients``, O(n * len(coefficients))."""
    n = int(num_rounds)
    c = np.asarray(coefficients, dtype=np.float64)[:n]
    k, b = participation_bounds(participation, n)
    sens2, _ = _sens_and_grad(c, n, k, b)
    return sens2 * toeplitz_error(toeplitz_inverse_coefs(c, n), error)


# ---------------------------------------------------------------------------------------------
# 1. Banded Toeplitz
# ---------------------------------------------------------------------------------------------


def _max_error_coefs(m: int) -> Array:
    """The Toeplitz square root of A (Fichtenberger, Henzinger, Upadhyay 2023), a good start."""
    k = np.arange(m, dtype=np.float64)
    ratios = np.ones(m)
    ratios[1:] = (2 * k[1:] - 1) / (2 * k[1:])
    return np.cumprod(ratios)


#: The objective's value where the loss is not finite (a wall the line search backs off from).
_WALL = 1e3


def _lbfgs(
    fun: Callable[[Array], tuple[float, Array]], x0: Array, maxiter: int
) -> optimize.OptimizeResult:
    """L-BFGS on log(loss): scale-free, and a loss that overflows (an unstable C^-1 off the
    feasible region) is a finite wall, which the line search of L-BFGS-B backs off from (an
    infinite or 1e300 value stops it instead)."""

    def log_fun(x: Array) -> tuple[float, Array]:
        with np.errstate(all="ignore"):
            value, grad = fun(x)
            ok = np.isfinite(value) and value > 0 and bool(np.all(np.isfinite(grad)))
            if not ok or math.log(value) > _WALL:
                return _WALL, np.zeros_like(x)
            return math.log(value), grad / value

    return optimize.minimize(
        log_fun,
        x0,
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": maxiter, "maxcor": 20, "ftol": 1e-15, "gtol": 1e-12},
    )


def optimize_banded_toeplitz(
    num_rounds: int,
    bands: int,
    participation: Participation | None = None,
    *,
    error: str = "mean",
    max_iterations: int = 5000,
) -> ToeplitzSolution:
    """The banded Toeplitz strategy minimising the objective, by L-BFGS on the Toeplitz
    parameterisation (McKenna 2024, arXiv:2405.15913, Sec. 4).

    The coefficients are optimised with c_0 = 1 (the loss is scale-free) and returned with unit
    norm, so every full column of C has norm 1. The loss and its analytic gradient cost
    O(n * bands): the first column h of C^-1 by recursion, A C^-1 Toeplitz with first column
    cumsum(h), ``||A C^-1||_F^2 = sum_t (n - t) cumsum(h)_t^2``.

    Sensitivity: single participation: ||c||; k participations b apart: exact (orthogonal
    columns) for bands <= b, else the bound for non-negative non-increasing coefficients, which
    the result is checked to satisfy.

    Raises
    ------
    ConfigError
        For num_rounds < 1, bands outside [1, num_rounds] or an unknown ``error``.
    RuntimeError
        If b < bands and the optimum violates the monotonicity the bound needs.
    """
    n = int(num_rounds)
    check(n >= 1, "num_rounds", num_rounds, "must be an integer >= 1")
    check(1 <= int(bands) <= n, "bands", bands, f"must be in [1, num_rounds={n}]")
    _error_weights(1, error)
    m = int(bands)
    k, b = participation_bounds(participation, n)
    start = time.perf_counter()
    if m == 1:
        c = np.ones(1)
        iterations = 0
    else:

        def fun(x: Array) -> tuple[float, Array]:
            c = np.concatenate(([1.0], x))
            h = signal.lfilter([1.0], c, _impulse(n))
            err, g_h = _error_and_grad_h(h, error)
            sens2, g_sens = _sens_and_grad(c, n, k, b)
            g_err = _grad_coefs_from_grad_h(
                h, g_h, lambda g: signal.lfilter([1.0], c, g[::-1])[::-1], m
            )
            return sens2 * err, (err * g_sens + sens2 * g_err)[1:]

        result = _lbfgs(fun, _max_error_coefs(m)[1:], max_iterations)
        c = np.concatenate(([1.0], result.x))
        iterations = int(result.nit)
        _check_minsep_valid(c, k, b)
    c = c / np.linalg.norm(c)
    seconds = time.perf_counter() - start
    return ToeplitzSolution(
        num_rounds=n,
        coefficients=tuple(float(v) for v in c),
        loss=toeplitz_loss(c, n, participation, error),
        seconds=seconds,
        error=error,
        iterations=iterations,
    )


# ---------------------------------------------------------------------------------------------
# 2. Buffered linear Toeplitz (BLT)
# ---------------------------------------------------------------------------------------------


def blt_coefficients(buffer_decays: Any, output_scales: Any, num_rounds: int) -> Array:
    """The Toeplitz coefficients (length n) of the BLT C: c_0 = 1,
    c_i = sum_j output_scales[j] * buffer_decays[j] ** (i - 1)."""
    theta = np.asarray(buffer_decays, dtype=np.float64)
    omega = np.asarray(output_scales, dtype=np.float64)
    n = int(num_rounds)
    out = np.ones(n)
    if n > 1:
        powers = theta[None, :] ** np.arange(n - 1, dtype=np.float64)[:, None]
        out[1:] = powers @ omega
    return out


def _blt_polynomials(theta: Array, omega: Array) -> tuple[Array, Array]:
    """(P, Q), ascending powers, with C(x) = sum_i c_i x^i = P(x) / Q(x):
    Q = prod_j (1 - theta_j x), P = Q + x sum_j omega_j prod_{l != j} (1 - theta_l x)."""
    q = np.array([1.0])
    for t in theta:
        q = np.convolve(q, [1.0, -t])
    p = np.concatenate((q, [0.0]))
    for j, w in enumerate(omega):
        r = np.array([1.0])
        for other, t in enumerate(theta):
            if other != j:
                r = np.convolve(r, [1.0, -t])
        p[1 : 1 + r.size] += w * r
    return p[: q.size], q


def blt_inverse_coefs(buffer_decays: Any, output_scales: Any, num_rounds: int) -> Array:
    """First column of C^-1 for the BLT C in O(n * buffers): the filter Q(x) / P(x)."""
    p, q = _blt_polynomials(
        np.asarray(buffer_decays, dtype=np.float64), np.asarray(output_scales, dtype=np.float64)
    )
    return np.asarray(signal.lfilter(q, p, _impulse(int(num_rounds))))


def blt_loss(
    buffer_decays: Any,
    output_scales: Any,
    num_rounds: int,
    participation: Participation | None = None,
    error: str = "mean",
) -> float:
    """The objective (module docstring) of the BLT C, O(n * buffers)."""
    n = int(num_rounds)
    k, b = participation_bounds(participation, n)
    c = blt_coefficients(buffer_decays, output_scales, n)
    sens2, _ = _sens_and_grad(c, n, k, b)
    h = blt_inverse_coefs(buffer_decays, output_scales, n)
    return sens2 * toeplitz_error(h, error)


def _sigmoid(x: Array) -> Array:
    return np.asarray(0.5 * (1.0 + np.tanh(0.5 * x)))


def _logit(p: Array) -> Array:
    return np.asarray(np.log(p) - np.log1p(-p))


def _blt_inits(n: int, buffers: int) -> list[tuple[Array, Array]]:
    """Starting points: decays 1 - d with d log-spaced from ~1/n to ~1/2, scales ~ sqrt(d)
    (a crude rational approximation of 1/sqrt(1 - x), cf. arXiv:2404.16706 Prop. 4.5)."""
    inits = []
    for low, high, gain in ((1.0, 0.5, 1.5), (3.0, 0.3, 1.0), (0.5, 0.7, 0.7)):
        d = np.geomspace(min(low / max(n, 2), 0.5), high, buffers)
        if buffers == 1:
            d = np.array([math.sqrt(min(low / max(n, 2), 0.5) * high)])
        omega = gain * np.sqrt(d) / max(1.0, float(np.sum(gain * np.sqrt(d))) / 0.9)
        inits.append((1.0 - d, omega))
    return inits


def optimize_blt(
    num_rounds: int,
    buffers: int,
    participation: Participation | None = None,
    *,
    error: str = "mean",
    max_iterations: int = 3000,
) -> BLTSolution:
    """The BLT strategy with ``buffers`` buffers minimising the objective, by L-BFGS on
    (logit(decays), log(scales)) with the loss computed from the Toeplitz coefficients in
    O(n log n) (Dvijotham et al. 2024, arXiv:2404.16706; the min-sep loss of McMahan, Xu,
    Zhang 2024, arXiv:2408.08868).

    C^-1 has the rational generating function Q/P (see :func:`blt_inverse_coefs`); the
    gradient of the error with respect to all n Toeplitz coefficients is one correlation
    (FFT), then the chain rule to decays and scales. Decays are kept in (0, 1) and scales
    positive, so the coefficients are positive and, when sum(scales) <= 1, non-increasing
    (checked for k > 1: the min-separation bound of arXiv:2405.13763 needs it). A few
    starting points are tried and the best kept. ``buffers = 0`` is the identity.
    """
    n = int(num_rounds)
    check(n >= 1, "num_rounds", num_rounds, "must be an integer >= 1")
    check(int(buffers) >= 0, "buffers", buffers, "must be an integer >= 0")
    _error_weights(1, error)
    nb = int(buffers)
    k, b = participation_bounds(participation, n)
    start = time.perf_counter()
    if nb == 0 or n == 1:
        seconds = time.perf_counter() - start
        return BLTSolution(
            num_rounds=n,
            buffer_decays=(),
            output_scales=(),
            loss=blt_loss([], [], n, participation, error),
            seconds=seconds,
            error=error,
        )
    idx = np.arange(n - 1, dtype=np.float64)

    def fun(x: Array) -> tuple[float, Array]:
        theta = _sigmoid(x[:nb])
        omega = np.exp(x[nb:])
        powers = theta[None, :] ** idx[:, None]
        c = np.concatenate(([1.0], powers @ omega))
        p, q = _blt_polynomials(theta, omega)
        h = signal.lfilter(q, p, _impulse(n))
        err, g_h = _error_and_grad_h(h, error)
        sens2, g_sens = _sens_and_grad(c, n, k, b)
        g_err = _grad_coefs_from_grad_h(h, g_h, lambda g: signal.lfilter(q, p, g[::-1])[::-1], n)
        value = sens2 * err
        g_c = (err * g_sens + sens2 * g_err)[1:]
        g_omega = powers.T @ g_c
        d_powers = np.zeros_like(powers)
        d_powers[1:] = idx[1:, None] * theta[None, :] ** (idx[1:, None] - 1.0)
        g_theta = omega * (d_powers.T @ g_c)
        grad = np.concatenate((g_theta * theta * (1.0 - theta), g_omega * omega))
        return value, grad

    best: tuple[float, Array, int] | None = None
    iterations = 0
    for theta0, omega0 in _blt_inits(n, nb):
        x0 = np.concatenate((_logit(np.clip(theta0, 1e-12, 1 - 1e-12)), np.log(omega0)))
        result = _lbfgs(fun, x0, max_iterations)
        iterations += int(result.nit)
        if best is None or result.fun < best[0]:
            best = (float(result.fun), result.x, int(result.nit))
    assert best is not None
    theta = _sigmoid(best[1][:nb])
    omega = np.exp(best[1][nb:])
    order = np.argsort(-theta)
    theta, omega = theta[order], omega[order]
    _check_minsep_valid(blt_coefficients(theta, omega, n), k, b)
    seconds = time.perf_counter() - start
    return BLTSolution(
        num_rounds=n,
        buffer_decays=tuple(float(v) for v in theta),
        output_scales=tuple(float(v) for v in omega),
        loss=blt_loss(theta, omega, n, participation, error),
        seconds=seconds,
        error=error,
        iterations=iterations,
    )


# ---------------------------------------------------------------------------------------------
# 3. Dense
# ---------------------------------------------------------------------------------------------


def prefix_gram(num_rounds: int) -> Array:
    """A^T A for the prefix workload: (A^T A)[i, j] = n - max(i, j) (0-based)."""
    n = int(num_rounds)
    idx = np.arange(n)
    return np.asarray(n - np.maximum(idx[:, None], idx[None, :]), dtype=np.float64)


def strategy_from_gram(gram: Array) -> Array:
    """The lower-triangular C with C^T C = X (``gram``, symmetric positive definite).

    Reverse-permute, Cholesky, reverse back: with J the reversal, J X J = L L^T (L lower), so
    X = (J L J)(J L^T J) and C = J L^T J is lower triangular with C^T C = J L L^T J = X. (The
    plain Cholesky factor satisfies L L^T = X, the other way round.)"""
    x = np.asarray(gram, dtype=np.float64)
    lower = np.linalg.cholesky(x[::-1, ::-1])
    return np.ascontiguousarray(lower.T[::-1, ::-1])


def dense_loss(matrix: Array, participation: Participation | None = None) -> float:
    """The mean-error objective of a lower-triangular C with unit column norms: sens^2 = k
    (single participation, or C b-banded under b-min-separation) times ||A C^-1||_F^2 / n."""
    c = np.asarray(matrix, dtype=np.float64)
    n = c.shape[0]
    k, b = participation_bounds(participation, n)
    inv = linalg.solve_triangular(c, np.eye(n), lower=True)
    bmat = np.cumsum(inv, axis=0)
    return float(k * np.sum(bmat * bmat) / n)


def _dense_single(n: int, tol: float, max_iterations: int) -> tuple[Array, float, int]:
    """Solve min tr(G X^-1) s.t. diag(X) = 1, X psd (G = A^T A) through its dual (Denisov
    et al. 2022, arXiv:2202.08312, Sec. 4). For multipliers lam > 0 the Lagrangian minimiser is
    X(lam) = L^-1/2 R L^-1/2 with R = (L^1/2 G L^1/2)^1/2, and the dual value
    D(lam) = 2 tr(R) - sum(lam) is a lower bound on the optimum, with gradient diag(X) - 1.
    D is maximised by L-BFGS over log(lam) (one eigendecomposition per evaluation; about 3x
    fewer than the fixed point lam <- diag(R) of the paper). Returns (X rescaled to unit
    diagonal, the best dual value, evaluations)."""
    g = prefix_gram(n)
    best: dict[str, Any] = {"dual": -math.inf}
    evaluations = 0

    def neg_dual(u: Array) -> tuple[float, Array]:
        nonlocal evaluations
        evaluations += 1
        lam = np.exp(u)
        s = np.sqrt(lam)
        evals, vecs = np.linalg.eigh(s[:, None] * g * s[None, :])
        roots = np.sqrt(np.maximum(evals, 0.0))
        diag_r = np.einsum("ij,j,ij->i", vecs, roots, vecs)
        dual = 2.0 * float(roots.sum()) - float(lam.sum())
        if dual > best["dual"]:
            best.update(dual=dual, s=s, vecs=vecs, roots=roots)
        return -dual / n, -(diag_r - lam) / n

    u0 = 0.5 * np.log(np.diag(g))
    optimize.minimize(
        neg_dual,
        u0,
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": max_iterations, "maxcor": 30, "ftol": 1e-16, "gtol": tol},
    )
    s, vecs, roots = best["s"], best["vecs"], best["roots"]
    x = ((vecs * roots) @ vecs.T) / s[:, None] / s[None, :]
    diag = np.sqrt(np.diag(x))
    x = x / diag[:, None] / diag[None, :]
    return 0.5 * (x + x.T), float(best["dual"]), evaluations


def _dense_banded(n: int, k: int, bands: int, max_iterations: int) -> tuple[Array, int]:
    """L-BFGS over the b-banded lower-triangular C, columns normalised to norm 1 (BandMF,
    Choquette-Choo et al. 2023, arXiv:2306.08153): columns b or more apart are orthogonal, so
    sens^2 = k for any k participations b apart. Gradient of ||A C^-1||_F^2:
    -2 B^T B C^-T with B = A C^-1, masked to the band, then through the normalisation."""
    rows, cols = np.tril_indices(n)
    keep = rows - cols < bands
    rows, cols = rows[keep], cols[keep]
    eye = np.eye(n)

    def unpack(x: Array) -> tuple[Array, Array]:
        raw = np.zeros((n, n))
        raw[rows, cols] = x
        norms = np.linalg.norm(raw, axis=0)
        return raw / norms[None, :], norms

    def fun(x: Array) -> tuple[float, Array]:
        c, norms = unpack(x)
        try:
            inv = linalg.solve_triangular(c, eye, lower=True, check_finite=False)
        except linalg.LinAlgError:
            return math.inf, np.zeros_like(x)
        bmat = np.cumsum(inv, axis=0)
        value = float(np.sum(bmat * bmat)) / n
        g_c = -2.0 * (bmat.T @ (bmat @ inv.T)) / n
        # through c_j = raw_j / ||raw_j||: g_raw_j = (g_j - c_j (c_j . g_j)) / ||raw_j||
        g_raw = (g_c - c * np.sum(c * g_c, axis=0)[None, :]) / norms[None, :]
        return k * value, k * g_raw[rows, cols]

    # start: the optimal single-participation Toeplitz square root of A, banded
    start = _max_error_coefs(bands)[rows - cols]
    result = _lbfgs(fun, start, max_iterations)
    c, _ = unpack(result.x)
    return c, int(result.nit)


def optimize_dense(
    num_rounds: int,
    participation: Participation | None = None,
    *,
    tol: float = 1e-10,
    max_iterations: int = 5000,
) -> DenseSolution:
    """The optimal dense strategy for the mean-error objective, n <= 2000.

    Single participation (also k = 1 or b >= n): min tr(A^T A X^-1) s.t. diag(X) = 1, X psd,
    by the dual fixed point of Denisov et al. 2022 (arXiv:2202.08312); ``gap`` is the duality
    gap (an optimality certificate). b-min-separation with k participations, and cyclic
    Poisson (k = ceil(n / b)): X = C^T C restricted to b-banded C with unit column norms
    (Choquette-Choo et al. 2023, arXiv:2306.08153; equal-column-norm constraint of
    arXiv:2211.06530), for which sens^2 = k exactly, by L-BFGS; ``gap`` is NaN.

    C is lower triangular with C^T C = X (:func:`strategy_from_gram`).

    Raises
    ------
    ConfigError
        For num_rounds outside [1, 2000] (one line naming ``num_rounds``).
    """
    n = int(num_rounds)
    check(
        1 <= n <= MAX_DENSE_ROUNDS,
        "num_rounds",
        num_rounds,
        f"must be in [1, {MAX_DENSE_ROUNDS}] for the dense optimiser (use banded Toeplitz or BLT)",
    )
    k, b = participation_bounds(participation, n)
    start = time.perf_counter()
    gap = float("nan")
    if k <= 1 or b >= n:
        x, dual, steps = _dense_single(n, tol, max_iterations)
        c = strategy_from_gram(x)
        loss = dense_loss(c, participation)
        gap = max(0.0, loss - dual / n)
    else:
        c, steps = _dense_banded(n, k, b, max_iterations)
        x = c.T @ c
        loss = dense_loss(c, participation)
    seconds = time.perf_counter() - start
    return DenseSolution(
        num_rounds=n,
        matrix=c,
        gram=x,
        loss=loss,
        seconds=seconds,
        gap=gap,
        iterations=steps,
    )


# ---------------------------------------------------------------------------------------------
# 4. Disk cache
# ---------------------------------------------------------------------------------------------

_SOLVERS: dict[str, tuple[str, type]] = {
    "banded_toeplitz": ("optimize_banded_toeplitz", ToeplitzSolution),
    "blt": ("optimize_blt", BLTSolution),
    "dense": ("optimize_dense", DenseSolution),
}


def default_cache_dir() -> Path:
    """``$FEDPRIV_MF_CACHE`` if set, else ``~/.cache/fedpriv/mf``."""
    env = os.environ.get("FEDPRIV_MF_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fedpriv" / "mf"


def _jsonable(value: Any) -> Any:
    if isinstance(value, Participation):
        return {
            "kind": value.kind.value,
            "max_participations": value.max_participations,
            "min_separation": value.min_separation,
            "client_sample_rate": value.client_sample_rate,
        }
    if isinstance(value, Mapping):
        return {str(key): _jsonable(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot key a cache entry on {type(value).__name__}: {value!r}")


def cache_key(kind: str, params: Mapping[str, Any]) -> str:
    """sha256 of the JSON of (kind, every input, :data:`SOLVER_VERSION`)."""
    payload = {"kind": kind, "params": _jsonable(dict(params)), "solver": SOLVER_VERSION}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _to_arrays(solution: Solution) -> dict[str, Array]:
    out: dict[str, Array] = {}
    for f in dataclasses.fields(solution):
        if f.name == "from_cache":
            continue
        value = getattr(solution, f.name)
        out[f.name] = np.asarray(value, dtype=np.float64 if isinstance(value, tuple) else None)
    return out


def _from_arrays(cls: type, data: Mapping[str, Array]) -> Solution:
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name == "from_cache":
            continue
        arr = np.asarray(data[f.name])
        if f.name in ("matrix", "gram"):
            kwargs[f.name] = np.array(arr, dtype=np.float64)
        elif f.name in ("coefficients", "buffer_decays", "output_scales"):
            kwargs[f.name] = tuple(float(v) for v in arr.reshape(-1))
        elif f.name in ("num_rounds", "iterations"):
            kwargs[f.name] = int(arr)
        elif f.name == "error":
            kwargs[f.name] = str(arr)
        else:
            kwargs[f.name] = float(arr)
    solution: Solution = cls(**kwargs, from_cache=True)
    return solution


def _load(path: Path, cls: type) -> Solution | None:
    try:
        with np.load(path, allow_pickle=False) as data:
            if str(data["__key_version__"]) != SOLVER_VERSION:
                return None
            return _from_arrays(cls, {name: data[name] for name in data.files})
    except Exception:  # noqa: BLE001 - any unreadable or partial file is a miss
        return None


def _store(path: Path, solution: Solution) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = _to_arrays(solution)
    arrays["__key_version__"] = np.asarray(SOLVER_VERSION)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            savez: Callable[..., None] = np.savez  # (numpy's stub types the kwargs as bool)
            savez(handle, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cached(
    kind: str, params: Mapping[str, Any], *, cache_dir: str | os.PathLike[str] | None = None
) -> Solution:
    """The solution of optimiser ``kind`` (``banded_toeplitz``, ``blt`` or ``dense``) for the
    keyword arguments ``params``, from ``<cache_dir>/<kind>-<sha256>.npz`` if a readable entry
    exists, else computed and stored atomically (temporary file, then ``os.replace``).

    ``cache_dir`` defaults to :func:`default_cache_dir`. A corrupt or partial file counts as a
    miss and is overwritten. The result's ``seconds`` is the wall time of the optimisation
    (for a hit: of the run that stored it, with ``from_cache=True``); the caller prints it.
    """
    check(kind in _SOLVERS, "kind", kind, f"must be one of {sorted(_SOLVERS)}")
    name, cls = _SOLVERS[kind]
    directory = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    path = directory / f"{kind}-{cache_key(kind, params)}.npz"
    if path.is_file():
        hit = _load(path, cls)
        if hit is not None:
            return hit
    solver = getattr(sys.modules[__name__], name)
    solution: Solution = solver(**params)
    _store(path, solution)
    return solution
