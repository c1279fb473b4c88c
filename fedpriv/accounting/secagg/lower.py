"""A realised pair for S local DP-SGD steps under secure aggregation (a lower bound on ε).

``secagg-dpsgd mechanism=gaussian`` accounts each round as ``S`` Poisson-subsampled Gaussian
steps with the summed noise σ (Heikkilä arXiv:2407.19286, Theorem 4.6): an upper bound. For a
lower bound take datasets where it is attained as far as the round's release allows:

* every record has a loss linear in the model, so its gradient is a constant vector; the
  target record's clipped gradient has norm ``C`` (say ``C e_1``), every other record's is 0;
* plain local SGD at a public learning rate, so a round's summed update reveals
  ``Y = Σ_s (B_s C e_1 + Z_s)``, ``B_s ~ Bernoulli(q)`` the record's Poisson draws and
  ``Z_s ~ N(0, σ² C² I)`` the summed noise of step ``s`` (all steps' noise of all clients).

Per unit of ``C`` the first coordinate is ``P = Σ_k Bin(S, q)(k) N(k, S σ²)`` with the record,
``Q = N(0, S σ²)`` without it (add/remove); the other coordinates are the same in both worlds.
``(P, Q)`` is the round's realised pair, and its PLD composed over the rounds bounds ε from
below. ``S = 1`` is the Poisson-subsampled Gaussian (both directions, dp-accounting). For
``S > 1`` the real line is cut into bins (a post-processing: divergences can only fall) and the
PLD of the two binned pmfs is discretized optimistically (Doroshenko, Ghazi, Kamath, Kumar,
Manurangsi arXiv:2207.04380); only the remove direction ``(P || Q)`` is used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from scipy import stats

from fedpriv.accounting.accountants.pld_grid import LOWER_DISCRETIZATION, optimistic_gaussian_pld
from fedpriv.common.errors import check

__all__ = ["LocalStepsGaussianRound"]

#: Bins per standard deviation of the round's noise ``sqrt(S) σ`` (at least).
BINS_PER_STD = 100
#: The bins cover the record's shifts ``[0, S]`` widened by this many standard deviations.
TAIL_STDS = 12.0
#: At most this many bins (the bin width grows instead; coarser bins only lower the bound).
MAX_BINS = 200_000


@dataclass(frozen=True)
class LocalStepsGaussianRound:
    """One round of ``steps`` local steps whose noisy sums are released only summed.

    Parameters
    ----------
    noise_multiplier : float
        σ > 0: std of one step's summed noise per unit of the clip ``C``.
    sample_rate : float
        q in [0, 1]: the record's Poisson rate per step.
    steps : int
        S >= 1 local steps per round.
    """

    noise_multiplier: float
    sample_rate: float
    steps: int

    def __post_init__(self) -> None:
        check(self.noise_multiplier > 0, "noise_multiplier", self.noise_multiplier, "must be > 0")
        check(0.0 <= self.sample_rate <= 1.0, "sample_rate", self.sample_rate, "must be in [0, 1]")
        check(self.steps >= 1, "steps", self.steps, "must be an integer >= 1")

    def lower_pld(self, interval: float = LOWER_DISCRETIZATION) -> Any:
        """A PLD dominated by the round's (module docstring), on a loss grid of ``interval``."""
        if self.steps == 1:
            return optimistic_gaussian_pld(self.noise_multiplier, self.sample_rate, interval)
        log_q, log_p = self._binned_log_pmfs()
        return pld_lib.from_two_probability_mass_functions(
            log_q, log_p, pessimistic_estimate=False, value_discretization_interval=interval
        )

    def _binned_log_pmfs(self) -> tuple[dict[int, float], dict[int, float]]:
        """Log masses of ``Q`` and ``P`` on the bins (two unbounded end bins included)."""
        s, steps = self.noise_multiplier * math.sqrt(self.steps), self.steps
        width = max(s / BINS_PER_STD, (steps + 2 * TAIL_STDS * s) / MAX_BINS)
        edges = np.arange(-TAIL_STDS * s, steps + TAIL_STDS * s + width, width)
        edges = np.concatenate([[-np.inf], edges, [np.inf]])
        weights = stats.binom.pmf(np.arange(steps + 1), steps, self.sample_rate)
        q_mass = _bin_masses(edges, 0.0, s)
        p_mass = sum(w * _bin_masses(edges, float(k), s) for k, w in enumerate(weights) if w > 0)
        return _log_dict(q_mass), _log_dict(np.asarray(p_mass))


def _bin_masses(edges: np.ndarray, mean: float, std: float) -> np.ndarray:
    """``N(mean, std²)`` mass of each bin, from the nearer tail (no cancellation)."""
    lo, hi = (edges[:-1] - mean) / std, (edges[1:] - mean) / std
    right = stats.norm.sf(lo) - stats.norm.sf(hi)
    left = stats.norm.cdf(hi) - stats.norm.cdf(lo)
    mass: np.ndarray = np.where(lo > 0, right, left).clip(min=0.0)
    return mass


def _log_dict(mass: np.ndarray) -> dict[int, float]:
    """``{bin: log mass}`` over the bins with positive mass."""
    return {int(i): float(math.log(m)) for i, m in enumerate(mass) if m > 0}
