"""Skellam mechanism: exact sampler, infinitely divisible shares, rounding bound, rotation,
modular encode/decode, wrap refusal, bad input.

Independent references: scipy.stats.skellam (pmf, sf), scipy.linalg.hadamard, Monte Carlo.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from scipy.linalg import hadamard

from fedpriv.common.errors import ConfigError
from fedpriv.mechanisms.skellam_noise import (
    SkellamMechanism,
    _fwht,
    centered_mod,
    conditional_round,
    rounded_norm_bound,
    sample_skellam,
    skellam_tail_bound,
    skellam_tail_threshold,
)


def chi2_pvalue(samples: np.ndarray, mu: float, kmax: int) -> float:
    """Chi-square goodness of fit of integer ``samples`` to Sk(mu) on bins -kmax..kmax + 2 tails."""
    edges = np.arange(-kmax, kmax + 1)
    observed = np.array(
        [np.sum(samples < -kmax)] + [np.sum(samples == k) for k in edges] + [np.sum(samples > kmax)]
    )
    dist = stats.skellam(mu, mu)
    probs = np.array([dist.cdf(-kmax - 1)] + [dist.pmf(k) for k in edges] + [dist.sf(kmax)])
    return float(stats.chisquare(observed, probs / probs.sum() * samples.size).pvalue)


def mech(**kw: object) -> SkellamMechanism:
    base: dict[str, object] = dict(
        bits=32, scale=100.0, mu=50.0, clipping_norm=1.0, num_clients=5, dim=37
    )
    base.update(rotation=False, scale_rule="no_wrap")  # the deterministic rule's tests
    base.update(kw)
    return SkellamMechanism(**base)  # type: ignore[arg-type]


class TestSampler:
    @pytest.mark.parametrize("mu", [0.7, 5.0, 1e6, 1e12])
    def test_mean_zero_variance_two_mu_int64(self, mu: float) -> None:
        n = 200_000
        x = sample_skellam(mu, n, np.random.default_rng(1))
        assert x.dtype == np.int64
        # tolerances: 5 standard errors; SE(mean) = sqrt(2mu/n), SE(var) ~ 2mu sqrt((2 + 1/(2mu))/n)
        assert abs(x.mean()) < 5 * math.sqrt(2 * mu / n)
        assert abs(x.var() / (2 * mu) - 1) < 5 * math.sqrt((2 + 1 / (2 * mu)) / n)

    def test_exact_integers_at_large_rate(self) -> None:
        # float32 Poisson sampling cannot return odd values above 2**24; exact sampling gives
        # both parities equally often (binomial SE 0.5/sqrt(n) = 0.0016; tolerance 0.01).
        x = sample_skellam(1e12, 100_000, np.random.default_rng(2))
        assert abs(np.mean(x % 2) - 0.5) < 0.01

    def test_chi_square_against_scipy(self) -> None:
        x = sample_skellam(3.0, 100_000, np.random.default_rng(3))
        assert chi2_pvalue(x, 3.0, kmax=9) > 1e-3
        # power check: the same test rejects a 10% larger parameter
        assert chi2_pvalue(x, 3.3, kmax=9) < 1e-6

    def test_shares_of_n_clients_sum_to_sk_mu(self) -> None:
        m = mech(mu=4.0, num_clients=5, dim=20_000)
        rng = np.random.default_rng(4)
        total = sum(m.noise(rng) for _ in range(5))
        assert m.mu_per_client == pytest.approx(0.8)
        assert chi2_pvalue(total, 4.0, kmax=8) > 1e-3

    def test_honest_but_curious_n_minus_1_shares_suffice(self) -> None:
        m = mech(mu=4.0, num_clients=5, dim=20_000, honest_but_curious=True)
        rng = np.random.default_rng(5)
        others = sum(m.noise(rng) for _ in range(4))
        assert m.mu_per_client == pytest.approx(1.0)
        assert chi2_pvalue(others, 4.0, kmax=8) > 1e-3

    @pytest.mark.parametrize("mu", [2.0, 50.0, 1000.0])
    def test_chernoff_tail_is_an_upper_bound(self, mu: float) -> None:
        for t in np.linspace(1, 12 * math.sqrt(2 * mu), 15):
            exact = stats.skellam(mu, mu).sf(math.ceil(t) - 1)  # P(X >= t)
            assert skellam_tail_bound(mu, t) >= exact * (1 - 1e-9)
        t = skellam_tail_threshold(mu, 1e-6)
        assert 2 * stats.skellam(mu, mu).sf(t - 1) <= 1e-6
        # and not vacuous: within 2x of the exact 1e-6 two-sided quantile
        assert t <= 2 * stats.skellam(mu, mu).isf(0.5e-6)


class TestRounding:
    def test_unconditional_rounding_exceeds_bound_rarely(self) -> None:
        # DDGauss Thm. 1: one unconditioned rounding exceeds the bound w.p. <= beta.
        rng = np.random.default_rng(6)
        d, c, beta = 2000, 10.0, math.exp(-0.5)
        x = rng.normal(size=d)
        x *= c / np.linalg.norm(x)
        bound = rounded_norm_bound(d, c, beta)
        low = np.floor(x)
        norms = [np.linalg.norm(low + (rng.random(d) < x - low)) for _ in range(2000)]
        assert np.mean(np.array(norms) > bound) <= beta
        # the bound is not loose by orders of magnitude: E||R(x)||^2 <= c^2 + d/4
        assert np.mean(np.square(norms)) <= c * c + d / 4

    def test_conditional_rounding_respects_bound_and_neighbours(self) -> None:
        rng = np.random.default_rng(7)
        v = rng.normal(size=(50, 300)) * 3
        bound = rounded_norm_bound(300, float(np.linalg.norm(v, axis=1).max()), 0.9)
        out = conditional_round(v, bound, rng)
        assert out.dtype == np.int64
        assert np.all(np.linalg.norm(out, axis=1) <= bound)
        assert np.all((out == np.floor(v)) | (out == np.ceil(v)))

    def test_quantize_rows_clip_and_bound(self) -> None:
        m = mech(dim=64, scale=30.0)
        x = np.random.default_rng(8).normal(size=(20, 64)) * 5  # norms >> C: clipped
        q = m.quantize(x, rng=9)
        assert q.shape == (20, 64)
        assert np.all(np.linalg.norm(q, axis=1) <= m.l2_sensitivity)
        assert m.l1_sensitivity == pytest.approx(min(m.l2_sensitivity**2, 8 * m.l2_sensitivity))


class TestRotation:
    def test_fwht_is_hadamard(self) -> None:
        x = np.random.default_rng(10).normal(size=(3, 16))
        np.testing.assert_allclose(_fwht(x), x @ hadamard(16).T, atol=1e-12)

    def test_rotation_keeps_norm_and_inverts(self) -> None:
        m = mech(dim=37, rotation=True)
        assert m.padded_dim == 64
        x = np.random.default_rng(11).normal(size=(4, 37))
        y = m.rotate(x, seed=3)
        np.testing.assert_allclose(np.linalg.norm(y, axis=1), np.linalg.norm(x, axis=1), rtol=1e-12)
        np.testing.assert_allclose(m.unrotate(y, seed=3), x, atol=1e-12)
        assert not np.allclose(m.unrotate(y, seed=4), x)  # the seed matters

    def test_rotation_flattens_a_spike(self) -> None:
        m = mech(dim=1024, rotation=True)
        y = m.rotate(np.eye(1024)[0], seed=1)
        assert np.abs(y).max() == pytest.approx(1 / 32)


class TestEncodeDecode:
    @pytest.mark.parametrize("rotation", [False, True])
    def test_modular_sum_decodes_to_signed_sum(self, rotation: bool) -> None:
        n, d = 6, 100
        m = mech(
            bits=24, scale=2.0**10, mu=1e4, num_clients=n, dim=d, rotation=rotation, max_summands=3
        )
        rng = np.random.default_rng(12)
        xs = [rng.normal(size=(3, d)) * 0.2 for _ in range(n)]
        signed = [m.privatize(x, rng=100 + i, seed=5) for i, x in enumerate(xs)]
        residues = [m.encode(x, rng=100 + i, seed=5) for i, x in enumerate(xs)]
        assert all(r.dtype == np.int64 and r.min() >= 0 and r.max() < 2**24 for r in residues)
        plain = np.sum(residues, axis=0)  # what the ideal aggregator returns
        modular = np.mod(plain, 2**24)  # what a modular secure sum returns
        expected = m.decode_signed(np.sum(signed, axis=0), seed=5)
        np.testing.assert_array_equal(m.decode_sum(plain, seed=5), expected)
        np.testing.assert_array_equal(m.decode_sum(modular, seed=5), expected)

    def test_decoded_sum_within_rounding_and_noise_bound(self) -> None:
        n, d, s = 5, 200, 2.0**12
        m = mech(bits=32, scale=s, mu=1.0, num_clients=n, dim=d)
        rng = np.random.default_rng(13)
        xs = [rng.normal(size=d) * 0.05 for _ in range(n)]
        decoded = m.decode_sum(np.sum([m.encode(x, rng) for x in xs], axis=0))
        # each client's coordinate rounds by < 1; the noise Sk(1) exceeds t w.p. <= 1e-9
        bound = (n + skellam_tail_threshold(m.mu, 1e-9 / d)) / s
        assert np.abs(decoded - np.sum(xs, axis=0)).max() <= bound

    def test_rounding_error_with_rotation(self) -> None:
        n, d, s = 4, 100, 2.0**8
        m = mech(scale=s, num_clients=n, dim=d, rotation=True)
        rng = np.random.default_rng(14)
        xs = [rng.normal(size=d) * 0.05 for _ in range(n)]
        q = np.sum([m.quantize(x, rng, seed=2) for x in xs], axis=0)
        err = np.linalg.norm(m.decode_signed(q, seed=2) - np.sum(xs, axis=0))
        assert err <= n * math.sqrt(m.padded_dim) / s  # < 1 per coordinate per client

    @given(st.lists(st.integers(-(2**30), 2**30 - 1), min_size=1, max_size=20), st.integers(1, 8))
    @settings(max_examples=50, deadline=None)
    def test_residues_roundtrip(self, values: list[int], reps: int) -> None:
        m = mech(bits=31)
        z = np.array(values, dtype=np.int64)
        r = m.to_residues(z)
        assert r.min() >= 0 and r.max() < 2**31
        np.testing.assert_array_equal(centered_mod(r * 1 + reps * 2**31, 31), z)


class TestWrap:
    def test_worst_case_input_does_not_wrap_at_required_bits(self) -> None:
        n, s, C = 7, 1000.0, 1.0
        probe = mech(bits=62, scale=s, mu=0.5, clipping_norm=C, num_clients=n, dim=8, beta=0.0)
        bits = probe.required_bits
        m = mech(bits=bits, scale=s, mu=0.5, clipping_norm=C, num_clients=n, dim=8, beta=0.0)
        x = np.zeros(8)
        x[0] = C  # every client at the clip on the same coordinate
        rng = np.random.default_rng(15)
        signed = np.sum([m.privatize(x, rng) for _ in range(n)], axis=0)
        decoded = m.decode_sum(m.to_residues(signed))
        np.testing.assert_array_equal(decoded, signed / s)
        # with one bit fewer the same sum wraps: the refusal is not vacuous
        assert signed[0] >= 2 ** (bits - 2)
        assert centered_mod(signed, bits - 1)[0] != signed[0]

    def test_too_few_bits_refused_naming_needed_bits(self) -> None:
        needed = mech(bits=62, num_clients=1000, scale=2.0**20, mu=1e9).required_bits
        with pytest.raises(ConfigError, match=f"need bits >= {needed}"):
            mech(bits=needed - 1, num_clients=1000, scale=2.0**20, mu=1e9)

    def test_required_bits_grow_with_clients_steps_and_summands(self) -> None:
        base = mech(bits=62)
        assert mech(bits=62, num_clients=50).required_bits > base.required_bits
        assert mech(bits=62, max_summands=1000).required_bits > base.required_bits
        assert mech(bits=62, mu=1e8, steps=100).required_bits > mech(bits=62, mu=1e8).required_bits


class TestChooseScale:
    def test_largest_scale_that_fits(self) -> None:
        kw = dict(
            bits=32,
            clipping_norm=0.5,
            num_clients=10,
            dim=26010,
            steps=12,
            max_summands=12 * 6000,
            rotation=False,
            scale_rule="no_wrap",
        )
        m = SkellamMechanism.from_noise_multiplier(1.3, **kw)
        assert m.mu == pytest.approx((m.scale * 1.3 * 0.5) ** 2 / 2)  # noise std s*sigma*C
        assert m.required_bits <= 32
        bigger = 1.01 * m.scale
        with pytest.raises(ConfigError, match="need bits >= 33"):
            SkellamMechanism(scale=bigger, mu=(bigger * 1.3 * 0.5) ** 2 / 2, **kw)  # type: ignore[arg-type]

    def test_no_scale_fits(self) -> None:
        with pytest.raises(ConfigError, match="no room for any scale"):
            SkellamMechanism.from_noise_multiplier(
                1.0,
                bits=8,
                clipping_norm=1.0,
                num_clients=100,
                dim=10,
                max_summands=10,
                rotation=False,
                scale_rule="no_wrap",
            )

    def test_sensitivities_match_the_accountant(self) -> None:
        # the accountant's independent helper (loss_models.skellam_rdp) on the padded dimension
        from fedpriv.accounting.loss_models.skellam_rdp import rounded_sensitivities

        for rotation, beta in [(False, 0.0), (True, math.exp(-0.5)), (False, 0.3)]:
            m = mech(dim=1000, scale=300.0, rotation=rotation, beta=beta)
            l1, l2 = rounded_sensitivities(m.clipping_norm, m.scale, m.padded_dim, beta)
            assert (m.l1_sensitivity, m.l2_sensitivity) == pytest.approx((l1, l2), rel=1e-12)


class TestBadInput:
    @pytest.mark.parametrize(
        ("field", "value"),
        [
            ("bits", 1),
            ("bits", 63),
            ("bits", 16.0),
            ("scale", 0.0),
            ("scale", -1.0),
            ("scale", float("inf")),
            ("mu", 0.0),
            ("mu", -2.0),
            ("clipping_norm", 0.0),
            ("num_clients", 0),
            ("dim", 0),
            ("beta", 1.0),
            ("steps", 0),
            ("max_summands", 0),
            ("wrap_probability", 0.0),
            ("dropout_tolerance", -1),
        ],
    )
    def test_field_out_of_range(self, field: str, value: object) -> None:
        with pytest.raises(ConfigError, match=field):
            mech(**{field: value})

    def test_noise_divisor_must_be_positive(self) -> None:
        with pytest.raises(ConfigError, match="num_clients"):
            mech(num_clients=3, dropout_tolerance=2, honest_but_curious=True)
        assert mech(num_clients=10, dropout_tolerance=2).mu_per_client == pytest.approx(50.0 / 8)

    def test_wrong_shapes_and_missing_seed(self) -> None:
        m = mech(dim=10, rotation=True)
        with pytest.raises(ConfigError, match="x.shape"):
            m.quantize(np.zeros(11), rng=0, seed=1)
        with pytest.raises(ConfigError, match="seed"):
            m.quantize(np.zeros(10), rng=0)
        with pytest.raises(ConfigError, match="total.shape"):
            m.decode_sum(np.zeros(10, dtype=np.int64), seed=1)
        with pytest.raises(ConfigError, match="total.dtype"):
            m.decode_sum(np.zeros(16), seed=1)

    def test_frozen(self) -> None:
        with pytest.raises(AttributeError):
            mech().bits = 8  # type: ignore[misc]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input_is_refused_never_rounded(bad: float) -> None:
    """A NaN/inf gradient must not become arbitrary integers that SecAgg+ would sum."""
    mech = SkellamMechanism.from_noise_multiplier(
        1.0, bits=32, clipping_norm=1.0, num_clients=2, dim=4, steps=1, max_summands=8
    )
    rows = np.ones((3, 4))
    rows[1, 2] = bad
    with pytest.raises(ValueError, match="non-finite"):
        mech.privatize(rows, np.random.default_rng(0), seed=1)
    out = mech.privatize(np.ones((3, 4)), np.random.default_rng(0), seed=1)
    assert out.shape == (mech.padded_dim,)
