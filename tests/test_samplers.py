"""Sample_{s,m} of the batch-clipping paper: shuffling covers each record once per epoch;
subsampling and Poisson inclusion frequencies match theory (chi-square)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from fedpriv.common.errors import ConfigError
from fedpriv.mechanisms.samplers import PoissonSampler, ShuffleSampler, SubsampleSampler


@pytest.mark.parametrize(("n", "m", "s"), [(60, 3, 4), (61, 2, 5), (7, 7, 1), (10, 1, 10)])
def test_shuffle_epoch_covers_each_record_once(n: int, m: int, s: int) -> None:
    sampler = ShuffleSampler(m, s)
    epoch = sampler.epoch(n, np.random.default_rng(0))
    r = n // (m * s)
    assert epoch.shape == (r, m, s)
    flat = epoch.reshape(-1)
    assert len(np.unique(flat)) == flat.size  # disjoint S_b, disjoint groups
    assert set(flat.tolist()) <= set(range(n))
    if n % (m * s) == 0:
        assert sorted(flat.tolist()) == list(range(n))  # every record exactly once


def test_shuffle_position_is_uniform() -> None:
    # each record lands in round b with probability 1/R (uniform permutation): chi-square
    n, m, s, reps = 24, 2, 3, 3000
    sampler, rng = ShuffleSampler(m, s), np.random.default_rng(1)
    r = n // (m * s)
    counts = np.zeros((n, r))
    for _ in range(reps):
        epoch = sampler.epoch(n, rng)
        for b in range(r):
            counts[epoch[b].reshape(-1), b] += 1
    chi2 = float(((counts - reps / r) ** 2 / (reps / r)).sum())
    # per record the R counts are multinomial: R-1 degrees of freedom each
    assert stats.chi2.sf(chi2, df=n * (r - 1)) > 1e-4


def test_subsample_inclusion_frequencies_and_size() -> None:
    n, m, s, reps = 50, 2, 4, 4000
    sampler, rng = SubsampleSampler(m, s), np.random.default_rng(2)
    q = m * s / n
    counts = np.zeros(n)
    for _ in range(reps):
        idx = sampler.sample(n, rng)
        assert idx.shape == (m, s) and len(np.unique(idx)) == m * s
        counts[idx.reshape(-1)] += 1
    # per index Binomial(reps, q); the total is fixed (reps m s), so the standardized sum of
    # squares is chi-square with n-1 dof; both tails checked at 1e-4
    expected = reps * q
    chi2 = float(((counts - expected) ** 2 / (expected * (1 - q))).sum())
    assert stats.chi2.sf(chi2, df=n - 1) > 1e-4
    assert stats.chi2.cdf(chi2, df=n - 1) > 1e-4


def test_poisson_inclusion_frequencies() -> None:
    n, q, reps = 100, 0.08, 4000
    sampler, rng = PoissonSampler(q), np.random.default_rng(3)
    counts = np.zeros(n)
    for _ in range(reps):
        counts[sampler.sample(n, rng)] += 1
    chi2 = float(
        ((counts - reps * q) ** 2 / (reps * q * (1 - q))).sum()
    )  # Binomial(reps, q) per index
    assert stats.chi2.sf(chi2, df=n) > 1e-4


@pytest.mark.parametrize("cls", [ShuffleSampler, SubsampleSampler])
def test_sampler_bad_sizes(cls: type) -> None:
    with pytest.raises(ConfigError, match="group_size=0 must be an integer >= 1"):
        cls(2, 0)
    with pytest.raises(
        ConfigError, match="num_groups=3 times group_size=4 must be <= the client's 11 samples"
    ):
        cls(3, 4).rounds_per_epoch(11)


def test_sampler_kind_is_the_closed_set() -> None:
    from fedpriv.common.validate import parse_enum
    from fedpriv.mechanisms.samplers import SamplerKind

    assert [k.value for k in SamplerKind] == ["shuffle", "subsample", "poisson"]
    assert SamplerKind("poisson") == "poisson"  # StrEnum: configs keep their spelling
    with pytest.raises(ConfigError) as info:
        parse_enum(SamplerKind, "client.sampler", "Shuffle")
    assert str(info.value) == (
        "client.sampler='Shuffle' must be one of: shuffle, subsample, poisson"
    )
