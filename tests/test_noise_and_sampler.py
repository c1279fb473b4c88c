"""Noise has the std it claims; the sum over N clients has std sigma*C; Poisson rates."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from clients.local_dpsgd import LocalDPSGD
from fedpriv.accounting.dpsgd import DPSGDSpec
from fedpriv.common.errors import ConfigError
from fedpriv.mechanisms.noise import add_gaussian_noise, make_generator
from fedpriv.mechanisms.samplers import PoissonSampler


def _chi2_std_interval(n: int, std: float, alpha: float = 1e-4) -> tuple[float, float]:
    """Two-sided (1-alpha) interval for the sample std of n N(0, std^2) draws (chi-square)."""
    lo, hi = stats.chi2.ppf([alpha / 2, 1 - alpha / 2], n)
    return std * math.sqrt(lo / n), std * math.sqrt(hi / n)


def test_gaussian_noise_std() -> None:
    gen = make_generator(1)
    out = add_gaussian_noise({"w": torch.zeros(200_000)}, 0.7, gen)["w"].double()
    lo, hi = _chi2_std_interval(out.numel(), 0.7)
    assert lo < float(out.pow(2).mean().sqrt()) < hi
    assert abs(float(out.mean())) < 5 * 0.7 / math.sqrt(out.numel())  # 5-sigma bound on the mean


def test_local_noise_sums_to_sigma_c() -> None:
    sigma, clip, n = 1.3, 0.5, 10
    algo = LocalDPSGD(
        privacy=DPSGDSpec(
            noise_multiplier=sigma, max_grad_norm=clip, sample_rate=0.1, num_clients=n
        )
    )
    assert algo.local_noise_stddev == pytest.approx(sigma * clip / math.sqrt(n), rel=1e-12)
    gens = [make_generator(100 + i) for i in range(n)]
    total = sum(
        add_gaussian_noise({"w": torch.zeros(50_000)}, algo.local_noise_stddev, g)["w"].double()
        for g in gens
    )
    lo, hi = _chi2_std_interval(total.numel(), sigma * clip)
    assert lo < float(total.pow(2).mean().sqrt()) < hi


def test_honest_but_curious_noise_share() -> None:
    algo = LocalDPSGD(
        privacy=DPSGDSpec(
            noise_multiplier=2.0,
            max_grad_norm=1.0,
            sample_rate=0.1,
            honest_but_curious=True,
            num_clients=5,
        )
    )
    assert algo.local_noise_stddev == pytest.approx(2.0 / math.sqrt(4))  # N-1 clients must suffice


def test_poisson_inclusion_frequencies() -> None:
    sampler = PoissonSampler(0.05)
    rng = np.random.default_rng(3)
    counts = np.zeros(200)
    reps = 4000
    for _ in range(reps):
        counts[sampler.sample(200, rng)] += 1
    # chi-square goodness of fit of per-index inclusion counts against Binomial(reps, q)
    expected = reps * 0.05
    chi2 = float(((counts - expected) ** 2 / (expected * (1 - 0.05))).sum())
    assert stats.chi2.sf(chi2, df=200) > 1e-4


def test_poisson_empty_batches() -> None:
    sampler = PoissonSampler(1e-3)
    rng = np.random.default_rng(0)
    sizes = [len(sampler.sample(10, rng)) for _ in range(2000)]
    assert sizes.count(0) > 1900  # P(empty) = 0.999^10 ~ 0.990
    assert sampler.sample(0, rng).shape == (0,)


@pytest.mark.parametrize("rate", [0.0, -0.1, 1.5])
def test_bad_sample_rate(rate: float) -> None:
    with pytest.raises(ConfigError, match="sample_rate"):
        PoissonSampler(rate)
