"""Correlated-noise strategies (DP-FTRL): streams against their analytic matrices, and the
sensitivity of the materialised noise against the analytic one (``fedpriv.mechanisms``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg

from fedpriv.common.errors import ConfigError
from fedpriv.mechanisms import correlated_noise as cn
from fedpriv.mechanisms.mf_sensitivity import (
    brute_force_sensitivity_squared,
    gram_from_noise_matrix,
    sensitivity_squared,
)
from fedpriv.mechanisms.participation import Participation

N = 24
SINGLE = Participation()
PATTERNS = [
    SINGLE,
    Participation(kind="min_separation", max_participations=3, min_separation=4),
    Participation(kind="min_separation", max_participations=10, min_separation=3),
    Participation(kind="cyclic_poisson", min_separation=5, client_sample_rate=0.5),
]
DENSE_C = np.tril(np.random.default_rng(1).random((30, 30))) + np.eye(30)
SQUARE = {
    "identity": cn.IdentityFactorization(),
    "banded": cn.BandedToeplitz((1.0, 0.5, 0.25)),
    "banded_normalized": cn.BandedToeplitz((1.0, 0.5, 0.25)).column_normalized(N),
    "blt": cn.BufferedLinearToeplitz((0.9, 0.5), (0.1, 0.2)),
    "blt_signed": cn.BufferedLinearToeplitz((0.9, 0.5), (0.3, -0.2)),
    "dense": cn.DenseFactorization(DENSE_C),
}
TREES = {e.value: cn.TreeAggregation(e) for e in cn.TreeEstimator}


def run_stream(f: cn.Factorization, z: np.ndarray, rounds: int) -> np.ndarray:
    """The stream's ``(rounds, dim)`` noise on the draws ``z`` (``(m, dim)``, in order)."""
    it = iter(z)
    stream = f.stream(z.shape[1])
    return np.stack([stream.step(lambda: next(it).copy()) for _ in range(rounds)])


@pytest.mark.parametrize("name", SQUARE)
def test_stream_solves_the_analytic_strategy(name: str) -> None:
    f = SQUARE[name]
    z = np.random.default_rng(0).standard_normal((N, 3))
    expected = scipy.linalg.solve_triangular(f.strategy_matrix(N), z, lower=True)
    assert np.abs(run_stream(f, z, N) - expected).max() <= 1e-6


def tree_prefix_estimator(c: np.ndarray, estimator: cn.TreeEstimator) -> np.ndarray:
    """``(n, m)`` prefix-noise rows from the ANALYTIC C alone: online, the greedy dyadic cover of
    rounds 1..t (largest node ending at t, repeat); Honaker, the least-squares (BLUE) estimate
    of the prefix sum from the nodes completed by round t, ``1^T C_t^+``."""
    n = c.shape[1]
    first = np.argmax(c > 0, axis=1)
    last = c.shape[1] - 1 - np.argmax(c[:, ::-1] > 0, axis=1)
    out = np.zeros((n, c.shape[0]))
    for t in range(n):
        done = np.flatnonzero(last <= t)
        if estimator is cn.TreeEstimator.HONAKER:
            out[t, done] = np.ones(t + 1) @ np.linalg.pinv(c[np.ix_(done, range(t + 1))])
            continue
        end = t
        while end >= 0:
            node = min((j for j in done if last[j] == end), key=lambda j: first[j])
            out[t, node] = 1.0
            end = first[node] - 1
    return out


@pytest.mark.parametrize("name", TREES)
def test_tree_stream_is_the_estimator_of_the_analytic_tree(name: str) -> None:
    f = TREES[name]
    n = 21
    c = f.strategy_matrix(n)
    m = f.num_draws(n)
    assert c.shape == (m, n) == (2 * n - bin(n).count("1"), n)
    z = np.random.default_rng(0).standard_normal((m, 3))
    prefix = tree_prefix_estimator(c, f.estimator)
    noise_matrix = np.diff(prefix, axis=0, prepend=0.0)  # per-round = prefix differences
    assert np.abs(run_stream(f, z, n) - noise_matrix @ z).max() <= 1e-6
    assert np.abs(f.noise_matrix(n) @ c - np.eye(n)).max() <= 1e-12  # unbiased: M C = I


@pytest.mark.parametrize("name", SQUARE)
@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: p.kind.value)
def test_materialized_sensitivity_equals_the_analytic_one(
    name: str, pattern: Participation
) -> None:
    f = SQUARE[name]
    analytic = f.analytic_sensitivity(pattern, N)
    assert f.materialized_sensitivity(pattern, N) == pytest.approx(analytic, rel=1e-9)


@pytest.mark.parametrize("name", TREES)
@pytest.mark.parametrize("n", [8, 21, 32])
@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: p.kind.value)
def test_tree_materialized_sensitivity_is_at_most_the_analytic(
    name: str, n: int, pattern: Participation
) -> None:
    # The noisy updates are a post-processing of the whole tree's release C G + Z (M C = I),
    # so X = (M M^T)^-1 <= C^T C (Loewner) and the single-participation value (X_ii) is at
    # most the tree's; online also discards the right children it never reads.
    f = TREES[name]
    assert f.materialized_sensitivity(pattern, n) <= f.analytic_sensitivity(pattern, n) + 1e-9


def test_tree_single_participation_sensitivity_counts_completed_levels() -> None:
    # Kairouz et al. 2021 (arXiv:2103.00039) Sec. 3: a leaf is in ceil(log2 n) + 1 nodes for
    # n a power of two; here only completed nodes carry noise: floor(log2 n) + 1.
    for n in (1, 2, 3, 4, 7, 8, 16, 1000, 1024):
        expected = math.sqrt(n.bit_length())
        assert cn.TreeAggregation().analytic_sensitivity(SINGLE, n) == pytest.approx(expected)
    assert cn.TreeAggregation().materialized_sensitivity(SINGLE, 16) == pytest.approx(
        math.sqrt(math.ceil(math.log2(16)) + 1), rel=1e-9
    )


def test_a_wrong_stream_is_caught() -> None:
    # X = C^T C needs the noise M = C^-1; a Cholesky factor of X taken the wrong way round
    # (L with L L^T = X, used as if L^T L = X) generates noise with another Gram matrix.
    c = cn.BufferedLinearToeplitz((0.9, 0.5), (0.1, 0.2)).strategy_matrix(N)
    x = c.T @ c
    wrong_l = np.linalg.cholesky(x)  # L L^T = X, L lower triangular
    right = math.sqrt(sensitivity_squared(x, PATTERNS[1]))
    wrong = cn.DenseFactorization(wrong_l)
    assert np.allclose(wrong_l @ wrong_l.T, x)
    assert abs(wrong.materialized_sensitivity(PATTERNS[1], N) / right - 1) > 1e-3
    assert abs(wrong.materialized_sensitivity(SINGLE, N) / math.sqrt(x.diagonal().max()) - 1) > 1e-3


@pytest.mark.parametrize("k,b", [(1, 1), (2, 1), (2, 2), (3, 2), (3, 3), (4, 2), (5, 1)])
def test_dynamic_program_bounds_the_brute_force(k: int, b: int) -> None:
    rng = np.random.default_rng(k * 10 + b)
    pattern = Participation(kind="min_separation", max_participations=k, min_separation=b)
    cyclic = Participation(kind="cyclic_poisson", min_separation=b, client_sample_rate=1.0)
    for n in (1, 4, 7, 10):
        a = rng.random((n, n))
        x = a + a.T
        for p in (pattern, cyclic, SINGLE):
            assert sensitivity_squared(x, p) >= brute_force_sensitivity_squared(x, p) - 1e-12
        banded = x * (np.abs(np.subtract.outer(range(n), range(n))) < b)
        for p in (pattern, cyclic):  # columns b apart orthogonal: the bound is exact
            got = sensitivity_squared(banded, p)
            assert got == pytest.approx(brute_force_sensitivity_squared(banded, p), rel=1e-12)
        assert sensitivity_squared(x, cyclic) == pytest.approx(
            brute_force_sensitivity_squared(x, cyclic), rel=1e-12
        )


# Golden values: google-deepmind/jax_privacy, matrix_factorization/sensitivity_test.py
# (test_banded, SensitivityUpperBoundTest); tolerance 1e-9 relative (theirs: 5 places).
JAX_C = np.array([[1.0, 0, 0, 0], [2.0, 1, 0, 0], [0, 1.0, 1, 0], [0, 0, 1.0, -6]])
JAX_DENSE_C = np.array([[1.0, 0, 0, 0], [2.0, 1, 0, 0], [0.5, 1.0, 1, 0], [0.4, 0, 1.0, -6]])


def test_golden_jax_privacy_sensitivities() -> None:
    f = cn.DenseFactorization(JAX_C)
    one = Participation(kind="min_separation", max_participations=1, min_separation=2)
    assert f.materialized_sensitivity(one, 4) == pytest.approx(6.0, rel=1e-9)
    for b in (2, 3):
        p = Participation(kind="min_separation", max_participations=4, min_separation=b)
        assert f.materialized_sensitivity(p, 4) == pytest.approx(math.sqrt(41.0), rel=1e-9)
        assert f.analytic_sensitivity(p, 4) == pytest.approx(math.sqrt(41.0), rel=1e-9)
    x = JAX_DENSE_C.T @ JAX_DENSE_C
    every = Participation(kind="min_separation", max_participations=4, min_separation=1)
    got = cn.DenseFactorization(JAX_DENSE_C).materialized_sensitivity(every, 4)
    assert got == pytest.approx(math.sqrt(np.abs(x).sum()), rel=1e-9)


def test_golden_tff_efficient_tree_values() -> None:
    # TensorFlow Federated dp_ftrl/tree_aggregation_test.py: with every node value 1 the
    # EfficientTreeAggregator's cumulative sums after t steps, and the online TreeAggregator's
    # (popcount(t)); noise variances 4/7 (t = 4) and 8/15 (t = 8). Tolerance 1e-12.
    golden = {1: 1.0, 2: 4 / 3, 3: 4 / 3 + 1, 4: 12 / 7, 7: 12 / 7 + 4 / 3 + 1, 8: 32 / 15}
    golden[1024] = 11 / (2 - 0.5**10)
    golden[1029] = 11 / (2 - 0.5**10) + 12 / 7 + 1
    ones = np.ones((2 * 1029, 1))
    honaker = np.cumsum(run_stream(TREES["honaker"], ones, 1029)[:, 0])
    online = np.cumsum(run_stream(TREES["online"], ones, 1029)[:, 0])
    for t, value in golden.items():
        assert honaker[t - 1] == pytest.approx(value, rel=1e-12)
    assert list(online[:8]) == [1, 1, 2, 1, 2, 2, 3, 1]
    var = TREES["honaker"].prefix_noise_variances(8)
    assert var[3] == pytest.approx(4 / 7) and var[7] == pytest.approx(8 / 15)
    assert var[6] == pytest.approx(4 / 7 + 2 / 3 + 1)


@pytest.mark.parametrize("f", [*SQUARE.values(), *TREES.values()], ids=[*SQUARE, *TREES])
def test_prefix_variances_memory_and_errors(f: cn.Factorization) -> None:
    m = f.noise_matrix(N)
    prefix = np.cumsum(m, axis=0)
    var = np.einsum("ij,ij->i", prefix, prefix)
    assert np.allclose(f.prefix_noise_variances(N), var, rtol=1e-9, atol=1e-12)
    sens = f.analytic_sensitivity(PATTERNS[1], N)
    assert f.workload_error(PATTERNS[1], N) == pytest.approx(sens * math.sqrt(var.mean()))
    assert f.max_workload_error(PATTERNS[1], N) == pytest.approx(sens * math.sqrt(var.max()))
    stream, held = f.stream(1), 0
    for _ in range(N):
        stream.step(lambda: np.zeros(1))
        held = max(held, stream.vectors_held)
    assert held == f.noise_vectors(N)


def test_identity_returns_each_draw_unchanged() -> None:
    stream = cn.IdentityFactorization().stream(3)
    draws = [np.arange(3.0) + i for i in range(5)]
    assert all(stream.step(lambda d=d: d) is d for d in draws)


def test_empirical_covariance_matches_m_m_transpose() -> None:
    # 20,000 independent streams (the coordinates) of the BLT: the sample covariance of the
    # noise of rounds 1..8 against M M^T, entrywise within 5 standard errors of the estimator
    # (se of a sample covariance: sqrt((S_ii S_jj + S_ij^2) / N)).
    f, n, reps = cn.BufferedLinearToeplitz((0.9, 0.5), (0.3, 0.2)), 8, 20_000
    rng = np.random.default_rng(7)
    w = run_stream(f, rng.standard_normal((n, reps)), n)
    sample = w @ w.T / reps
    m = f.noise_matrix(n)
    s = m @ m.T
    se = np.sqrt((np.outer(s.diagonal(), s.diagonal()) + s**2) / reps)
    assert np.all(np.abs(sample - s) <= 5 * se)


def test_gram_from_noise_matrix_paths_agree() -> None:
    c = SQUARE["blt"].strategy_matrix(10)
    m = np.linalg.inv(c)
    padded = np.hstack([m, np.zeros((10, 3))])  # not square: the Cholesky path
    assert np.allclose(gram_from_noise_matrix(m), c.T @ c)
    assert np.allclose(gram_from_noise_matrix(padded), c.T @ c)


@pytest.mark.parametrize(
    "build,field",
    [
        (lambda: cn.BandedToeplitz(()), "factorization.coefficients"),
        (lambda: cn.BandedToeplitz((0.0, 1.0)), "factorization.coefficients"),
        (lambda: cn.BandedToeplitz((1.0, math.nan)), "factorization.coefficients"),
        (lambda: cn.BandedToeplitz((1.0,), 0), "factorization.column_normalized_for"),
        (lambda: cn.BufferedLinearToeplitz((1.0,), (0.1,)), "factorization.buffer_decays"),
        (
            lambda: cn.BufferedLinearToeplitz((0.5,), (0.1, 0.2)),
            "factorization.output_scales",
        ),
        (lambda: cn.TreeAggregation("lsq"), "factorization.estimator"),  # type: ignore
        (lambda: cn.DenseFactorization(np.ones((3, 3))), "factorization.matrix"),
        (lambda: cn.DenseFactorization(np.eye(2001)), "factorization.matrix"),
        (lambda: cn.IdentityFactorization().noise_matrix(0), "num_rounds"),
        (lambda: SQUARE["banded_normalized"].strategy_matrix(N + 1), "num_rounds"),
    ],
)
def test_bad_input_gets_one_config_error_line(build: object, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        build()  # type: ignore[operator]
    assert info.value.field == field
    assert "\n" not in str(info.value)
