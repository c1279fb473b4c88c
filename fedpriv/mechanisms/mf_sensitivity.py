"""Sensitivity of a matrix-factorization (correlated-noise) mechanism under bounded participation.

A mechanism that releases ``G + sigma M Z`` (``M``: the noise-generating matrix, n x m) is a
Gaussian mechanism with covariance ``sigma^2 M M^T``; its Gram matrix is ``X = (M M^T)^-1``
(``= C^T C`` for a square invertible strategy ``C = M^-1``). One client adds ``g_i`` (norm <= 1)
to the rounds ``i`` of a participation set ``S``; the squared sensitivity is

    sup_S sup_{g} sum_{i, j in S} X_ij <g_i, g_j>  <=  max_S sum_{i, j in S} |X_ij|,

with equality when ``X >= 0`` elementwise (all ``g_i`` equal). Indices here are 0-based rounds.

References
----------
Choquette-Choo, McMahan, Rush, Thakurta, "Multi-Epoch Matrix Factorization Mechanisms for
Private Machine Learning" (arXiv:2211.06530), Sec. 2, Eq. (3)-(4) (b-min-separation);
Choquette-Choo, Ganesh, McKenna, McMahan, Rush, Thakurta, Xu, "(Amplified) Banded Matrix
Factorization" (arXiv:2306.08153), Eq. (5) (the |X| relaxation), Alg. 3 (VecSens: the 1-D
dynamic program) and Alg. 4 (the row-wise upper bound); implemented in jax_privacy as
``matrix_factorization/sensitivity.py``: ``max_participation_for_linear_fn`` and
``get_min_sep_sensitivity_upper_bound_for_X`` (google-deepmind/jax_privacy).
"""

from __future__ import annotations

import itertools

import numpy as np
import scipy.linalg

from fedpriv.mechanisms.participation import Participation, ParticipationKind

#: Rows of |X| processed together by the row-wise dynamic program (memory: BLOCK x n).
_BLOCK = 256


def max_pattern_sum(values: np.ndarray, participation: Participation) -> float:
    """``max_S sum_{i in S} values[i]`` over the participation sets ``S`` of the pattern.

    Parameters
    ----------
    values : np.ndarray
        ``(n,)`` nonnegative per-round values (e.g. squared column norms).
    participation : Participation
        single: one round; min_separation (k, b): at most ``k`` rounds pairwise ``>= b``
        apart; cyclic_poisson (b groups): any subset of one residue class ``g + b Z``.

    Returns
    -------
    float
        The maximum (exact: a 1-D dynamic program, arXiv:2306.08153 Alg. 3).
    """
    v = np.asarray(values, dtype=np.float64)
    n = v.shape[0]
    if n == 0:
        return 0.0
    kind, b = participation.kind, participation.separation
    if kind is ParticipationKind.SINGLE:
        return float(max(v.max(), 0.0))
    if kind is ParticipationKind.CYCLIC_POISSON:
        return float(max(np.clip(v[g::b], 0, None).sum() for g in range(min(b, n))))
    k = participation.max_participations_in(n)
    f = np.zeros(n + b)  # f[p]: best with at most r picks among rounds >= p
    for _ in range(k):
        g = f.copy()
        g[:n] = v + f[b : b + n]
        f = np.maximum.accumulate(g[::-1])[::-1]
    return float(f[0])


def _best_after(a: np.ndarray, b: int, kmax: int) -> np.ndarray:
    """``R[r, i]``: the largest sum of at most ``r`` entries of row ``i`` of ``a`` taken in
    columns ``>= i + b``, pairwise ``>= b`` apart (``(kmax, n)``; ``R[0] = 0``).

    The 1-D dynamic program of arXiv:2306.08153 Alg. 3, run on blocks of rows at once over
    the reversed columns a block needs (contiguous prefix maxima): ``O(kmax n^2 / 2)`` time.
    """
    n = a.shape[0]
    out = np.zeros((kmax, n))
    for i0 in range(0, max(n - b, 0), _BLOCK):
        i1 = min(i0 + _BLOCK, n - b)
        width = n - i0 - b  # the block reads reversed columns q < width only
        rev = np.ascontiguousarray(a[i0:i1, : i0 + b - 1 : -1])  # rev[:, q] = a[:, n-1-q]
        rows = np.arange(i1 - i0)
        q = n - 1 - (i0 + rows + b)
        h = np.zeros_like(rev)  # h[:, q]: best of at most r picks among reversed cols <= q
        g = np.empty_like(rev)
        for r in range(1, kmax):
            g[:, :b] = rev[:, :b]
            np.add(rev[:, b:], h[:, : max(width - b, 0)], out=g[:, b:])
            np.maximum.accumulate(g, axis=1, out=h)
            out[r, i0:i1] = h[rows, q]
    return out


def _row_bounds(a: np.ndarray, b: int, k: int) -> np.ndarray:
    """``r_i = max_{S valid, i in S, |S| <= k} sum_{j in S} a_ij`` for every row (``(n,)``)."""
    right = _best_after(a, b, k)
    left = _best_after(np.ascontiguousarray(a[::-1, ::-1]), b, k)[:, ::-1]
    best = np.max(left + right[::-1], axis=0)  # max over l + r = k - 1 (both monotone in r)
    return np.asarray(np.diag(a) + best, dtype=np.float64)


def sensitivity_squared(gram: np.ndarray, participation: Participation) -> float:
    """An upper bound on the squared sensitivity of the mechanism with Gram matrix ``gram``.

    Parameters
    ----------
    gram : np.ndarray
        ``(n, n)`` symmetric positive definite X (per unit clipping norm, squared).
    participation : Participation
        The pattern over the n rounds.

    Returns
    -------
    float
        single: ``max_i X_ii`` (exact). cyclic_poisson (b groups): ``max_g sum |X_S|`` over the
        residue class ``S = g + b Z`` (exact when ``X >= 0``). min_separation (k, b):
        ``max_S sum_{i in S} r_i`` with ``r_i`` the best sum of ``|X_ij|`` over valid sets
        containing ``i`` (a row-wise relaxation of ``max_S sum |X_S|``; it is at most
        ``k max_i r_i`` and exact when ``X_ij = 0`` for ``|i - j| >= b``, e.g. a strategy with
        at most b bands, and for identity). ``O(k n^2)``.

    References
    ----------
    arXiv:2306.08153 Alg. 4 (jax_privacy ``get_min_sep_sensitivity_upper_bound_for_X``, whose
    row sets need not contain ``i``; requiring it here keeps the bound valid and tighter).
    """
    x = np.asarray(gram, dtype=np.float64)
    n = x.shape[0]
    kind, b = participation.kind, participation.separation
    if kind is ParticipationKind.SINGLE or participation.max_participations_in(n) == 1:
        return float(np.diag(x).max())
    a = np.abs(x)
    if kind is ParticipationKind.CYCLIC_POISSON:
        return float(max(a[g::b, g::b].sum() for g in range(min(b, n))))
    k = participation.max_participations_in(n)
    return max_pattern_sum(_row_bounds(a, b, k), participation)


def attained_sensitivity_squared(
    gram: np.ndarray, participation: Participation
) -> tuple[float, tuple[int, ...]]:
    """A squared sensitivity that ONE client attains, and its participation set: a lower bound.

    A client that adds the same unit vector in every round of a valid set ``S`` moves the
    release by ``||C 1_S||``, so ``1_S^T X 1_S`` (signed entries) is attained; the largest over
    candidate sets is returned: single, every round; cyclic_poisson, every full residue class;
    min_separation (k, b), the k rounds ``o, o + d, o + 2d, ...`` for every offset ``o < b`` and
    spacings ``d`` in ``{b, max(b, floor((n - 1) / (k - 1)))}``. It equals
    :func:`sensitivity_squared` when the relaxation is exact (``X >= 0`` elementwise and no
    entry at distance ``>= b``, e.g. BandMF with at most b bands, and identity).

    Parameters
    ----------
    gram : np.ndarray
        ``(n, n)`` Gram matrix X of the noise the stream generates.
    participation : Participation
        The pattern over the n rounds.

    Returns
    -------
    tuple[float, tuple[int, ...]]
        ``(1_S^T X 1_S, S)`` with S 0-based rounds.
    """
    x = np.asarray(gram, dtype=np.float64)
    n = x.shape[0]
    kind, b = participation.kind, participation.separation
    if kind is ParticipationKind.CYCLIC_POISSON:
        candidates = [tuple(range(g, n, b)) for g in range(min(b, n))]
    elif kind is ParticipationKind.SINGLE or participation.max_participations_in(n) == 1:
        candidates = [(i,) for i in range(n)]
    else:
        k = participation.max_participations_in(n)
        spacings = {b, max(b, (n - 1) // (k - 1))}
        candidates = [tuple(range(o, n, d))[:k] for d in sorted(spacings) for o in range(min(b, n))]
    best = max(candidates, key=lambda s: float(x[np.ix_(s, s)].sum()))
    return float(x[np.ix_(best, best)].sum()), best


def _valid_sets(n: int, participation: Participation) -> list[tuple[int, ...]]:
    """Every nonempty participation set of the pattern over ``n`` rounds (tiny n only)."""
    kind, b = participation.kind, participation.separation
    if kind is ParticipationKind.SINGLE:
        return [(i,) for i in range(n)]
    if kind is ParticipationKind.CYCLIC_POISSON:
        classes = [tuple(range(g, n, b)) for g in range(min(b, n))]
        return [s for c in classes for r in range(1, len(c) + 1) for s in _subsets(c, r)]
    k = participation.max_participations_in(n)
    sets = [s for r in range(1, k + 1) for s in itertools.combinations(range(n), r)]
    return [s for s in sets if all(j - i >= b for i, j in itertools.pairwise(s))]


def _subsets(items: tuple[int, ...], r: int) -> list[tuple[int, ...]]:
    return list(itertools.combinations(items, r))


def brute_force_sensitivity_squared(gram: np.ndarray, participation: Participation) -> float:
    """``max_S sum_{i, j in S} |X_ij|`` by enumerating every valid set (n <= ~14).

    Parameters
    ----------
    gram : np.ndarray
        ``(n, n)`` Gram matrix X.
    participation : Participation
        The pattern.

    Returns
    -------
    float
        The squared sensitivity when ``X >= 0`` elementwise (an upper bound otherwise).

    Raises
    ------
    ValueError
        For n > 16 (the enumeration is exponential).
    """
    a = np.abs(np.asarray(gram, dtype=np.float64))
    n = a.shape[0]
    if n > 16:
        raise ValueError(f"brute force needs n <= 16, got {n}")
    return max(float(a[np.ix_(s, s)].sum()) for s in _valid_sets(n, participation))


def gram_from_noise_matrix(noise: np.ndarray) -> np.ndarray:
    """X = (M M^T)^-1 of a noise-generating matrix ``M`` (float64).

    Parameters
    ----------
    noise : np.ndarray
        ``(n, m)`` M with ``m >= n`` and full row rank.

    Returns
    -------
    np.ndarray
        ``(n, n)`` X: ``C^T C`` with ``C = M^-1`` by a triangular solve when M is square lower
        triangular; otherwise ``(M M^T)^-1`` through a Cholesky factorization.

    Raises
    ------
    numpy.linalg.LinAlgError
        When ``M M^T`` is singular (M is not of full row rank).
    """
    m = np.asarray(noise, dtype=np.float64)
    n = m.shape[0]
    if m.shape == (n, n) and not np.triu(m, 1).any():
        c = scipy.linalg.solve_triangular(m, np.eye(n), lower=True)
        x = c.T @ c
    else:
        factor = scipy.linalg.cho_factor(m @ m.T, lower=True)
        x = scipy.linalg.cho_solve(factor, np.eye(n))
    return np.asarray((x + x.T) / 2, dtype=np.float64)


def toeplitz_sensitivity_squared(coefficients: np.ndarray, participation: Participation) -> float:
    """Exact squared sensitivity of the n x n lower-triangular Toeplitz C with nonnegative,
    non-increasing coefficients ``c_0 >= c_1 >= ... >= 0``.

    The worst pattern is ``k`` participations exactly ``b`` apart from round 0 (for cyclic
    Poisson: group 0, ``k = ceil(n / b)``), so the value is ``||sum_{i<k} C[:, i b]||^2``.

    Parameters
    ----------
    coefficients : np.ndarray
        ``(n,)`` ``c_0 .. c_{n-1}`` (the first column of C).
    participation : Participation
        The pattern over the n rounds.

    Raises
    ------
    ValueError
        When the coefficients are negative or increase somewhere.

    References
    ----------
    Kalinin, Lampert, "Banded Square Root Matrix Factorization for Differentially Private
    Model Training" (arXiv:2405.13763), Thm. 2; jax_privacy ``toeplitz.minsep_sensitivity_
    squared`` (google-deepmind/jax_privacy).
    """
    c = np.asarray(coefficients, dtype=np.float64)
    if np.any(c < 0) or np.any(np.diff(c) > 0):
        raise ValueError("Toeplitz coefficients must be nonnegative and non-increasing")
    n = c.size
    k, b = participation.max_participations_in(n), participation.separation
    total = np.zeros(n)
    for i in range(k):
        total[i * b :] += c[: n - i * b]
    return float(total @ total)


def toeplitz_first_column(strategy: np.ndarray, rtol: float = 1e-9) -> np.ndarray | None:
    """The first column of ``strategy`` when it is (to ``rtol``) lower-triangular Toeplitz
    with nonnegative, non-increasing coefficients; else None.

    Parameters
    ----------
    strategy : np.ndarray
        ``(n, n)`` C.
    rtol : float
        Tolerance relative to ``|c_0|``, absorbing rounding of a materialised matrix.
    """
    c = np.asarray(strategy, dtype=np.float64)
    n = c.shape[0]
    col = c[:, 0]
    tol = rtol * max(abs(col[0]), 1e-300)
    expected = scipy.linalg.toeplitz(col, np.zeros(n))
    if np.abs(c - expected).max() > tol or np.any(col < -tol) or np.any(np.diff(col) > tol):
        return None
    return np.asarray(np.maximum.accumulate(np.clip(col, 0, None)[::-1])[::-1])
