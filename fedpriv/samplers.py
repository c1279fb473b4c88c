"""Batch samplers over a client's local data set (indices ``0..num_samples-1``).

Each sampler states the sampling that the accountant must compose; they never choose the
accountant themselves (see :mod:`fedpriv.accounting`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedpriv.errors import check


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
