"""Batch samplers over a client's local data set (indices ``0..num_samples-1``).

Each sampler states the sampling that the accountant must compose; they never choose the
accountant themselves (see :mod:`fedpriv.accounting`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from fedpriv.common.errors import check


class SamplerKind(StrEnum):
    """``Sample_{s,m}`` of the first paper, or Poisson sampling (the closed set of samplers).

    ``shuffle`` (SH): one permutation per epoch cut into disjoint rounds; ``subsample`` (SS):
    each round ``m s`` records without replacement; ``poisson``: each record independently
    with probability ``q`` (individual clipping only).

    References
    ----------
    van Dijk et al., "Generalizing DP-SGD with Shuffling and Batch Clipping" (arXiv:2212.05796),
    Sec. 3 (Sample_{s,m}); Abadi et al. 2016 (Poisson sampling of DP-SGD).
    """

    SHUFFLE = "shuffle"
    SUBSAMPLE = "subsample"
    POISSON = "poisson"


def as_generator(rng: np.random.Generator | int | None) -> np.random.Generator:
    """A numpy Generator from a Generator, a seed, or ``None`` (OS entropy)."""
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


@dataclass(frozen=True)
class PoissonSampler:
    """Poisson sampling: each index is included independently with probability ``sample_rate``.

    Batches have variable size (possibly 0). This is the sampling of DP-SGD's privacy
    analysis (Abadi et al. 2016; Mironov et al. 2019, "Rényi DP of the Sampled Gaussian").

    Parameters
    ----------
    sample_rate : float
        Inclusion probability q in (0, 1].
    """

    sample_rate: float

    def __post_init__(self) -> None:
        check(0 < self.sample_rate <= 1, "sample_rate", self.sample_rate, "must be in (0, 1]")

    def sample(self, num_samples: int, rng: np.random.Generator | int | None) -> np.ndarray:
        """One batch: sorted int64 indices, shape ``(B,)`` with ``B ~ Binomial(num_samples, q)``."""
        gen = as_generator(rng)
        return np.flatnonzero(gen.random(num_samples) < self.sample_rate).astype(np.int64)


@dataclass(frozen=True)
class _GroupedSampler:
    """``Sample_{s,m}``: rounds of ``m`` groups of ``s`` records (first paper, Sec. 3).

    Parameters
    ----------
    num_groups : int
        m >= 1, groups per round.
    group_size : int
        s >= 1, records per group.
    """

    num_groups: int
    group_size: int

    def __post_init__(self) -> None:
        _check_sizes(self.num_groups, self.group_size)

    def rounds_per_epoch(self, num_samples: int) -> int:
        """``N // (m s)`` (the rounds counted as one epoch).

        Raises :class:`ConfigError` if ``m s > N``.
        """
        return _rounds_per_epoch(num_samples, self.num_groups, self.group_size)


@dataclass(frozen=True)
class ShuffleSampler(_GroupedSampler):
    """Shuffling (the first paper's SH): one random permutation per epoch cut into disjoint S_b.

    An epoch over ``N`` records has ``R = N // (m s)`` rounds; round ``b`` takes positions
    ``[b m s, (b+1) m s)`` of the epoch's permutation, split into ``m`` consecutive groups
    of ``s`` (a uniformly random partition, since the permutation is uniform). The
    ``N - R m s`` records at the end of the permutation are not used in that epoch.

    References
    ----------
    van Dijk et al., "Generalizing DP-SGD with Shuffling and Batch Clipping" (arXiv:2212.05796),
    Sec. 3 (Sample_{s,m}, shuffling).
    """

    def epoch(self, num_samples: int, rng: np.random.Generator | int | None) -> np.ndarray:
        """All rounds of one epoch: int64 indices of shape ``(R, m, s)``, pairwise distinct."""
        r = self.rounds_per_epoch(num_samples)
        perm = as_generator(rng).permutation(num_samples).astype(np.int64)
        return perm[: r * self.num_groups * self.group_size].reshape(
            r, self.num_groups, self.group_size
        )


@dataclass(frozen=True)
class SubsampleSampler(_GroupedSampler):
    """Subsampling (the first paper's SS): each S_b uniform without replacement, size ``m s``.

    Rounds are independent; ``S_b`` is split into ``m`` groups of ``s`` at random.

    References
    ----------
    van Dijk et al. (arXiv:2212.05796), Sec. 3 (Sample_{s,m}, subsampling).
    """

    def sample(self, num_samples: int, rng: np.random.Generator | int | None) -> np.ndarray:
        """One round: int64 indices of shape ``(m, s)``, all distinct, uniformly random."""
        self.rounds_per_epoch(num_samples)
        size = self.num_groups * self.group_size
        idx = as_generator(rng).choice(num_samples, size=size, replace=False).astype(np.int64)
        return idx.reshape(self.num_groups, self.group_size)


def _check_sizes(num_groups: int, group_size: int) -> None:
    for name, v in (("num_groups", num_groups), ("group_size", group_size)):
        check(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1,
            name,
            v,
            "must be an integer >= 1",
        )


def _rounds_per_epoch(num_samples: int, num_groups: int, group_size: int) -> int:
    check(
        num_groups * group_size <= num_samples,
        "num_groups",
        num_groups,
        f"times group_size={group_size} must be <= the client's {num_samples} samples",
    )
    return num_samples // (num_groups * group_size)
