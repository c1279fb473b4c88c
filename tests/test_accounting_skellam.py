"""Skellam RDP (AKL21), Steinke's Poisson-subsampling bound, rounding sensitivities."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import special, stats

from fedpriv.accounting.core.ledger import IncompatibleEventsError, PrivacyLedger
from fedpriv.accounting.core.vocabulary import Accountant, Conversion
from fedpriv.accounting.dpsgd import poisson_gaussian_event
from fedpriv.accounting.loss_models.skellam import (
    SkellamEvent,
    rounded_sensitivities,
    skellam_rdp,
)
from fedpriv.accounting.samplers.poisson import poisson_subsampled_rdp
from fedpriv.accounting.skellam import SkellamSpec
from fedpriv.common.errors import ConfigError

logging.getLogger("absl").setLevel(logging.ERROR)
ORDERS = np.arange(2, 33, dtype=float)


def renyi_1d(log_p: np.ndarray, log_q: np.ndarray, alpha: float) -> float:
    """D_α(P‖Q) = 1/(α−1) ln Σ_k P(k)^α Q(k)^{1−α}, from log-pmfs on a common grid."""
    ok = np.isfinite(log_p) & np.isfinite(log_q)  # far tails underflow to -inf in both
    return float(special.logsumexp(alpha * log_p[ok] - (alpha - 1) * log_q[ok]) / (alpha - 1))


def skellam_logpmf(mu: float, shift: int, k: np.ndarray) -> np.ndarray:
    # scipy's skellam(mu1, mu2) = Pois(mu1) − Pois(mu2): our Sk(μ) is skellam(μ, μ).
    return stats.skellam.logpmf(k - shift, mu, mu)


@pytest.mark.parametrize("sigma,q", [(0.7, 0.1), (1.3, 0.05), (3.0, 0.5), (1.0, 1.0)])
def test_steinke_bound_equals_exact_subsampled_gaussian(sigma, q):
    # For the Gaussian ε(j) = j/(2σ²) the bound is the exact integer-order formula of
    # Mironov, Talwar, Zhang 2019, which dp-accounting implements independently.
    orders = np.arange(2, 256, dtype=float)
    ours = poisson_subsampled_rdp(orders, q, lambda a: a / (2 * sigma**2))
    ref = rdp_privacy_accountant._compute_rdp_poisson_subsampled_gaussian(q, sigma, orders)
    np.testing.assert_allclose(ours, ref, rtol=1e-10)  # float rounding only


def test_skellam_tends_to_gaussian_for_large_mu():
    # Sk(μ) has variance 2μ; for μ → ∞ its RDP → the Gaussian's αΔ2²/(2·2μ).
    mu, d1, d2 = 1e8, 30.0, 3.0
    np.testing.assert_allclose(
        skellam_rdp(ORDERS, mu, d1, d2), ORDERS * d2**2 / (4 * mu), rtol=1e-6
    )


@pytest.mark.parametrize("mu,shift", [(2.0, 1), (10.0, 1), (50.0, 2), (200.0, 3)])
def test_skellam_bound_dominates_exact_1d_divergence(mu, shift):
    # 1-D: Δ1 = Δ2 = shift. The exact Rényi divergence (numeric sum over the integers) must be
    # below AKL21's bound and, for large μ, close to the Gaussian value (bound is tight).
    width = int(shift + 40 * math.sqrt(2 * mu) + 60)
    k = np.arange(-width, width + 1)
    lp, lq = skellam_logpmf(mu, shift, k), skellam_logpmf(mu, 0, k)
    bound = skellam_rdp(ORDERS, mu, shift, shift)
    for alpha, b in zip(ORDERS, bound):
        exact = max(renyi_1d(lp, lq, alpha), renyi_1d(lq, lp, alpha))
        assert exact <= b * (1 + 1e-9)
        if mu >= 50:
            assert exact >= alpha * shift**2 / (4 * mu) * 0.9  # within 10 % of the Gaussian
    # The exact divergence of this 1-D pair for μ=2, α=2 by hand (closed sum, mpmath-free):
    # independent double check of the numeric routine on a small case.
    if mu == 2.0:
        direct = math.log(sum(math.exp(2 * a - b) for a, b in zip(lp, lq)))
        assert renyi_1d(lp, lq, 2.0) == pytest.approx(direct, rel=1e-12)


@pytest.mark.parametrize("mu,q", [(3.0, 0.1), (20.0, 0.3), (5.0, 0.02)])
def test_subsampled_skellam_bound_dominates_exact_1d(mu, q):
    # Add/remove with Poisson sampling: the pair is (mixture, base) in both orders, where the
    # mixture is (1−q)·Sk(μ) + q·(1 + Sk(μ)). Exact numeric divergences vs Steinke's bound.
    k = np.arange(-int(40 * math.sqrt(2 * mu) + 60), int(40 * math.sqrt(2 * mu) + 62))
    lq = skellam_logpmf(mu, 0, k)
    lmix = np.logaddexp(math.log1p(-q) + lq, math.log(q) + skellam_logpmf(mu, 1, k))
    bound = SkellamEvent(mu=mu, l1_sensitivity=1.0, l2_sensitivity=1.0, sample_rate=q).rdp(ORDERS)
    for alpha, b in zip(ORDERS, bound):
        exact = max(renyi_1d(lmix, lq, alpha), renyi_1d(lq, lmix, alpha))
        assert exact <= b * (1 + 1e-9)


def test_rounded_sensitivities_by_hand():
    # Unconditional rounding: Δ2 = sC + √d; Δ1 = Δ2·min(√d, Δ2).
    l1, l2 = rounded_sensitivities(1.0, 100.0, 100, beta=0.0)
    assert l2 == pytest.approx(110.0)
    assert l1 == pytest.approx(110.0 * 10.0)
    # Conditional rounding, β = e^{-1/2}: √(2 ln(1/β)) = 1, so
    # Δ2² = 100² + 100/4 + 1·(100 + 10/2) = 10130.
    l1, l2 = rounded_sensitivities(1.0, 100.0, 100, beta=math.exp(-0.5))
    assert l2 == pytest.approx(math.sqrt(10130.0), rel=1e-12)
    # Small norms, conditional rounding: Δ2² = 0.01 + 2500 + (0.1 + 50) = 2550.11 < d, so
    # the integer-vector bound ℓ1 ≤ ‖x‖2² is the smaller one.
    l1, l2 = rounded_sensitivities(0.1, 1.0, 10_000, beta=math.exp(-0.5))
    assert l2 == pytest.approx(math.sqrt(2550.11), rel=1e-12)
    assert l1 == pytest.approx(2550.11, rel=1e-12)
    for kwargs in ({"clipping_norm": 0.0}, {"scale": -1.0}, {"num_params": 0}, {"beta": 1.0}):
        args = {"clipping_norm": 1.0, "scale": 1.0, "num_params": 10, "beta": 0.0, **kwargs}
        with pytest.raises(ConfigError):
            rounded_sensitivities(**args)


def test_32_bit_skellam_matches_gaussian_accounting():
    # With 32 bits the scale is ~1e8 and rounding/discreteness are negligible: Skellam ε
    # equals the Gaussian's at integer orders (third paper, Table 1 "no quantization").
    spec = SkellamSpec(
        noise_multiplier=0.69,
        num_params=100_000,
        sample_rate=0.1,
        bits=32,
        num_clients=1,
        conversion=Conversion.MIRONOV,
    )
    assert spec.accountant is Accountant.RDP  # the family's default
    ev = spec.step_event()
    assert spec.epsilon(1) == ev.epsilon(1e-5, 1, "mironov")  # the ledger composes the same
    gauss = PrivacyLedger("rdp", "mironov")
    gauss.record(poisson_gaussian_event(0.69, 0.1))
    assert ev.epsilon(1e-5, 1, "mironov") == pytest.approx(gauss.get_epsilon(1e-5), rel=1e-5)
    assert ev.epsilon(1e-5, 1, "mironov") >= gauss.get_epsilon(1e-5)  # rounding only adds


def test_few_bits_cost_privacy():
    # Fewer bits → smaller scale → relatively larger rounding inflation → larger ε.
    eps = [
        SkellamSpec(
            noise_multiplier=1.0, num_params=10_000, sample_rate=0.05, bits=b, num_clients=10
        )
        .step_event()
        .epsilon(1e-5, 100)
        for b in (18, 20, 24, 32)
    ]
    assert eps[0] > eps[1] > eps[2] >= eps[3]


def test_skellam_event_in_ledger():
    ev = SkellamEvent(mu=5000.0, l1_sensitivity=20.0, l2_sensitivity=10.0, sample_rate=0.1)
    ledger = PrivacyLedger("rdp")
    ledger.record(ev, 40)
    ledger.record(poisson_gaussian_event(1.0, 0.1), 10)
    eps = ledger.get_epsilon(1e-5)
    alone = PrivacyLedger("rdp")
    alone.record(ev, 40)
    assert eps > alone.get_epsilon(1e-5) > 0
    again = PrivacyLedger.from_dict(json.loads(json.dumps(ledger.to_dict())))
    assert again.get_epsilon(1e-5) == eps
    with pytest.raises(IncompatibleEventsError, match="rdp"):
        PrivacyLedger("pld").record(ev)
    with pytest.raises(ConfigError, match="orders"):
        ev.rdp(np.array([1.5, 2.0]))
    with pytest.raises(ConfigError, match="sample_rate"):
        SkellamEvent(mu=1.0, l1_sensitivity=1.0, l2_sensitivity=1.0, sample_rate=2.0)


def test_skellam_monotone():
    base = dict(num_params=1000, sample_rate=0.05, bits=16, num_clients=5)
    e1 = SkellamSpec(noise_multiplier=1.0, **base).step_event()
    e2 = SkellamSpec(noise_multiplier=1.5, **base).step_event()
    assert e1.epsilon(1e-5, 200) > e1.epsilon(1e-5, 100) > e2.epsilon(1e-5, 100)
