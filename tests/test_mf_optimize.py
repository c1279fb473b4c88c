"""Optimisers of matrix-factorization strategies (fedpriv.mechanisms.mf_optimize)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from fedpriv.common.errors import ConfigError
from fedpriv.mechanisms import mf_optimize as mf
from fedpriv.mechanisms.participation import Participation

MINSEP = Participation(kind="min_separation", max_participations=3, min_separation=6)


def _toeplitz(coefs: np.ndarray, n: int) -> np.ndarray:
    c = np.zeros((n, n))
    for j, value in enumerate(coefs[:n]):
        c += value * np.eye(n, k=-j)
    return c


def _explicit_loss(c: np.ndarray, sens2: float, error: str = "mean") -> float:
    n = c.shape[0]
    b = np.tri(n) @ np.linalg.inv(c)
    rows = np.sum(b * b, axis=1)
    return sens2 * float(rows.mean() if error == "mean" else rows.max())


# --- Toeplitz error formula ------------------------------------------------------------------


@pytest.mark.parametrize("bands", [1, 2, 5, 17, 40])
@pytest.mark.parametrize("error", ["mean", "max"])
def test_toeplitz_error_matches_explicit_matrix(bands: int, error: str) -> None:
    rng = np.random.default_rng(bands)
    n = 40
    coefs = np.concatenate(([1.0 + rng.random()], 0.3 * rng.normal(size=bands - 1)))
    c = _toeplitz(coefs, n)
    h = mf.toeplitz_inverse_coefs(coefs, n)
    np.testing.assert_allclose(h, np.linalg.inv(c)[:, 0], rtol=1e-12, atol=1e-12)
    explicit = _explicit_loss(c, 1.0, error)
    assert mf.toeplitz_error(h, error) == pytest.approx(explicit, rel=1e-9)
    sens2 = float(np.max(np.sum(c * c, axis=0)))
    assert mf.toeplitz_loss(coefs, n, error=error) == pytest.approx(sens2 * explicit, rel=1e-9)


def test_minsep_sensitivity_matches_brute_force() -> None:
    # Non-negative, non-increasing coefficients: the worst of all patterns of k participations
    # at least b apart is the one exactly b apart from round 1 (arXiv:2405.13763, Thm. 2).
    n, k, b = 12, 3, 4
    coefs = np.array([1.0, 0.6, 0.5, 0.45, 0.3, 0.2, 0.1])
    gram = _toeplitz(coefs, n).T @ _toeplitz(coefs, n)
    best = 0.0
    for i in range(n):
        for j in range(i + b, n):
            for m in range(j + b, n):
                u = np.zeros(n)
                u[[i, j, m]] = 1.0
                best = max(best, float(u @ gram @ u))
    assert mf.minsep_sensitivity_squared(coefs, n, k, b) == pytest.approx(best, rel=1e-12)


def test_blt_coefficients_and_inverse() -> None:
    theta, omega, n = (0.9, 0.5), (0.1, 0.3), 30
    c = mf.blt_coefficients(theta, omega, n)
    assert c[0] == 1.0
    assert c[3] == pytest.approx(0.1 * 0.9**2 + 0.3 * 0.5**2)
    np.testing.assert_allclose(
        mf.blt_inverse_coefs(theta, omega, n), mf.toeplitz_inverse_coefs(c, n), atol=1e-13
    )


# --- banded Toeplitz -------------------------------------------------------------------------


def test_banded_toeplitz_one_band_is_identity_and_more_bands_never_worse() -> None:
    n = 64
    identity = (n + 1) / 2  # sens 1, ||A||_F^2 / n = n (n + 1) / 2 / n
    one = mf.optimize_banded_toeplitz(n, 1)
    assert one.coefficients == (1.0,)
    assert one.loss == pytest.approx(identity, rel=1e-12)
    losses = [mf.optimize_banded_toeplitz(n, bands).loss for bands in (1, 2, 4, 8, 16, 64)]
    assert losses[1] < identity
    assert all(b <= a * (1 + 1e-9) for a, b in zip(losses, losses[1:]))
    best = mf.optimize_banded_toeplitz(n, 16)
    assert np.linalg.norm(best.coefficients) == pytest.approx(1.0)
    assert best.loss == pytest.approx(mf.toeplitz_loss(best.coefficients, n), rel=1e-12)
    assert best.seconds >= 0


def test_banded_toeplitz_min_separation() -> None:
    n = 60
    identity = mf.toeplitz_loss([1.0], n, MINSEP)
    assert identity == pytest.approx(3 * (n + 1) / 2)
    sol = mf.optimize_banded_toeplitz(n, 6, MINSEP)  # bands <= b: columns b apart orthogonal
    assert sol.loss < identity
    c = _toeplitz(np.array(sol.coefficients), n)
    assert sol.loss == pytest.approx(_explicit_loss(c, 3.0), rel=1e-9)


def test_full_band_max_error_is_the_toeplitz_square_root_of_a() -> None:
    # Known optimum: for max error and single participation the optimal Toeplitz strategy is
    # the square root of A, c_k = prod_{i<=k} (2i - 1) / (2i) (Fichtenberger, Henzinger,
    # Upadhyay 2023; optimal per Dvijotham et al. 2024, arXiv:2404.16706), with loss
    # (sum_k c_k^2)^2 since B = C.
    n = 64
    sol = mf.optimize_banded_toeplitz(n, n, error="max")
    k = np.arange(1, n)
    root = np.cumprod(np.concatenate(([1.0], (2 * k - 1) / (2 * k))))
    np.testing.assert_allclose(sol.coefficients, root / np.linalg.norm(root), atol=1e-6)
    assert sol.loss == pytest.approx(np.sum(root**2) ** 2, rel=1e-9)


# --- BLT -------------------------------------------------------------------------------------


def test_blt_beats_identity_and_more_buffers_help() -> None:
    n = 200
    zero = mf.optimize_blt(n, 0)
    assert zero.buffer_decays == () and zero.loss == pytest.approx((n + 1) / 2)
    one, two = mf.optimize_blt(n, 1), mf.optimize_blt(n, 2)
    assert two.loss <= one.loss < zero.loss
    assert all(0 < t < 1 for t in two.buffer_decays) and all(w > 0 for w in two.output_scales)
    assert list(two.buffer_decays) == sorted(two.buffer_decays, reverse=True)
    c = _toeplitz(mf.blt_coefficients(two.buffer_decays, two.output_scales, n), n)
    sens2 = float(np.max(np.sum(c * c, axis=0)))
    assert two.loss == pytest.approx(_explicit_loss(c, sens2), rel=1e-8)


def test_blt_near_optimal_bound() -> None:
    # jax_privacy buffered_toeplitz_test.py (test_optimize_single_participation_near_optimal):
    # for n=1000, 3 buffers, sqrt(max loss) <= 1.03 (1 + ln(n) / pi) (the bound of Mathias,
    # arXiv:2404.16706 Eq. 2.8).
    n = 1000
    sol = mf.optimize_blt(n, 3, error="max")
    assert math.sqrt(sol.loss) <= 1.03 * (1 + math.log(n) / math.pi)


def test_blt_min_separation_valid() -> None:
    n = 120
    sol = mf.optimize_blt(n, 2, MINSEP)
    coefs = mf.blt_coefficients(sol.buffer_decays, sol.output_scales, n)
    assert np.all(np.diff(coefs) <= 0) and np.all(coefs > 0)
    assert sol.loss < mf.toeplitz_loss([1.0], n, MINSEP)


@pytest.mark.slow
def test_blt_golden_n100000() -> None:
    # Golden values: jax_privacy buffered_toeplitz_test.py,
    # test_optimize_single_participation_golden (n=100,000, 2 buffers, max error, single
    # participation), rtol 1e-5 there and here. (About 15 s.)
    sol = mf.optimize_blt(100_000, 2, error="max")
    np.testing.assert_allclose(sol.output_scales, [0.0122853238, 0.1878393665], rtol=1e-5)
    np.testing.assert_allclose(sol.buffer_decays, [0.9999528892, 0.9857068667], rtol=1e-5)


# --- dense -----------------------------------------------------------------------------------


def _tree_baseline_loss(n: int) -> float:
    """Binary-tree aggregation (each prefix sum from its dyadic nodes, no Honaker), n a power
    of two: sens^2 = log2(n) + 1, error per prefix = number of dyadic intervals."""
    levels = int(math.log2(n)) + 1
    counts = [bin(t).count("1") for t in range(1, n + 1)]
    return levels * float(np.mean(counts))


@pytest.mark.parametrize("n", [8, 32])
def test_dense_single_participation_optimum(n: int) -> None:
    sol = mf.optimize_dense(n)
    c, x = sol.matrix, sol.gram
    assert np.all(np.triu(c, 1) == 0)  # lower triangular
    np.testing.assert_allclose(c.T @ c, x, atol=1e-10, rtol=0)
    np.testing.assert_allclose(np.diag(x), 1.0, atol=1e-12)
    assert sol.gap <= 1e-8 * sol.loss  # duality gap: the optimum
    assert sol.loss == pytest.approx(_explicit_loss(c, 1.0), rel=1e-9)
    assert sol.loss <= mf.optimize_banded_toeplitz(n, n).loss * (1 + 1e-9)
    assert sol.loss <= _tree_baseline_loss(n)


def test_strategy_from_gram_orientation() -> None:
    rng = np.random.default_rng(0)
    m = rng.normal(size=(6, 6))
    x = m @ m.T + 6 * np.eye(6)
    c = mf.strategy_from_gram(x)
    assert np.all(np.triu(c, 1) == 0)
    np.testing.assert_allclose(c.T @ c, x, atol=1e-10)
    # the plain Cholesky factor is the other way round (L L^T = X), not a C^T C factor
    lower = np.linalg.cholesky(x)
    assert not np.allclose(lower.T @ lower, x)


def test_dense_min_separation_banded() -> None:
    n = 24
    participation = Participation(kind="min_separation", max_participations=3, min_separation=8)
    sol = mf.optimize_dense(n, participation)
    c = sol.matrix
    rows, cols = np.nonzero(c)
    assert np.all(rows >= cols) and np.all(rows - cols < 8)  # lower triangular, 8-banded
    np.testing.assert_allclose(np.diag(sol.gram), 1.0, atol=1e-12)
    np.testing.assert_allclose(c.T @ c, sol.gram, atol=1e-12)
    assert sol.loss == pytest.approx(_explicit_loss(c, 3.0), rel=1e-9)
    assert sol.loss <= mf.optimize_banded_toeplitz(n, 8, participation).loss * (1 + 1e-6)


def test_dense_refuses_large_n() -> None:
    with pytest.raises(ConfigError, match="num_rounds"):
        mf.optimize_dense(2001)


# --- cache -----------------------------------------------------------------------------------


def test_cache_hit_corrupt_file_and_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, object]] = []
    real = mf.optimize_blt

    def counting(**kwargs: object) -> mf.BLTSolution:
        calls.append(kwargs)
        return real(**kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(mf, "optimize_blt", counting)
    params = {"num_rounds": 50, "buffers": 1, "participation": MINSEP}
    first = mf.cached("blt", params, cache_dir=tmp_path)
    second = mf.cached("blt", params, cache_dir=tmp_path)
    assert len(calls) == 1
    assert not first.from_cache and second.from_cache
    assert second.buffer_decays == first.buffer_decays and second.loss == first.loss
    assert second.seconds == first.seconds
    files = list(tmp_path.glob("blt-*.npz"))
    assert len(files) == 1 and not list(tmp_path.glob("*.tmp"))

    files[0].write_bytes(files[0].read_bytes()[:40])  # partial write
    third = mf.cached("blt", params, cache_dir=tmp_path)
    assert len(calls) == 2 and not third.from_cache
    assert mf.cached("blt", params, cache_dir=tmp_path).from_cache

    key = mf.cache_key("blt", params)
    for change in (
        {"num_rounds": 51},
        {"buffers": 2},
        {"participation": None},
        {
            "participation": Participation(
                kind="min_separation", max_participations=3, min_separation=7
            )
        },
        {"error": "max"},
    ):
        assert mf.cache_key("blt", {**params, **change}) != key
    assert mf.cache_key("dense", params) != key


def test_cache_dense_roundtrip_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDPRIV_MF_CACHE", str(tmp_path / "env"))
    assert mf.default_cache_dir() == tmp_path / "env"
    first = mf.cached("dense", {"num_rounds": 8})
    second = mf.cached("dense", {"num_rounds": 8})
    assert isinstance(second, mf.DenseSolution) and second.from_cache
    np.testing.assert_array_equal(first.matrix, second.matrix)
    np.testing.assert_array_equal(first.gram, second.gram)
    assert len(list((tmp_path / "env").glob("dense-*.npz"))) == 1
    tol = mf.cached("banded_toeplitz", {"num_rounds": 8, "bands": 3})
    assert isinstance(tol, mf.ToeplitzSolution) and len(tol.coefficients) == 3
