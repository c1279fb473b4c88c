"""Multi-step local DP-SGD with local Gaussian noise whose SUM over clients is private.

Third paper (secagg-multiple-local-steps, Alg. 1 / Thm 4.6-4.7): each of the ``steps`` local
steps draws a Poisson batch of the client's data at ``sample_rate``, clips per-sample
gradients to ``max_grad_norm`` C, sums them, adds N(0, (σC)²/N) noise (σ =
``noise_multiplier``, N = ``num_clients``; N−1 if ``honest_but_curious``) and takes an SGD
step. The client sends its model delta; the aggregator reveals only the sum over clients,
whose per-step noise is N(0, (σC)²): one Poisson-subsampled Gaussian per step on the union
of the clients' data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from clients.base import ClientAlgorithm, ClientData, TrainContext
from fedpriv.accounting.calibrate import calibrate_noise_multiplier
from fedpriv.accounting.dpsgd import poisson_gaussian_event
from fedpriv.errors import check
from fedpriv.noise import add_gaussian_noise
from fedpriv.persample import clipped_grad_sum
from fedpriv.samplers import PoissonSampler


def summed_cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy summed over the batch (per-sample losses add up)."""
    return nn.functional.cross_entropy(out, y, reduction="sum")


@dataclass(frozen=True)
class LocalDPSGD(ClientAlgorithm):
    """Local DP-SGD, ``steps`` steps per round, noise shared across ``num_clients``.

    Parameters
    ----------
    steps : int
        Local DP-SGD steps per server round (S), >= 1.
    lr : float
        Step size γ; the step is ``θ ← θ − γ (g + ξ) / (q n)`` with q n the expected batch.
    privacy : dict
        The run's ``privacy`` group (noise_multiplier, max_grad_norm, sample_rate, ...).
    num_clients : int
        N, the number of clients whose noise adds up in the aggregated sum.

    Raises
    ------
    ConfigError
        For out-of-range fields.
    """

    steps: int = 10
    lr: float = 1.0
    momentum: float = 0.0
    privacy: dict[str, Any] = field(default_factory=dict)
    num_clients: int = 1

    def __post_init__(self) -> None:
        check(
            isinstance(self.steps, int) and self.steps >= 1,
            "client.steps",
            self.steps,
            "must be an integer >= 1",
        )
        check(self.lr > 0, "client.lr", self.lr, "must be > 0")
        check(0 <= self.momentum < 1, "client.momentum", self.momentum, "must be in [0, 1)")
        check(self.num_clients >= 1, "num_clients", self.num_clients, "must be >= 1")
        check(
            self.noise_shares >= 1,
            "num_clients",
            self.num_clients,
            "must be >= 2 with privacy.honest_but_curious=true",
        )

    @property
    def noise_multiplier(self) -> float:
        return float(self.privacy.get("noise_multiplier") or 0.0)

    @property
    def max_grad_norm(self) -> float:
        return float(self.privacy.get("max_grad_norm", 1.0))

    @property
    def sample_rate(self) -> float:
        return float(self.privacy.get("sample_rate", 1.0))

    @property
    def noise_shares(self) -> int:
        """Clients whose noise the privacy of the sum relies on (N, or N−1 if honest-but-curious)."""
        return self.num_clients - (1 if self.privacy.get("honest_but_curious") else 0)

    @property
    def local_noise_stddev(self) -> float:
        """Each client's noise std per step: σ C / √(noise_shares)."""
        return self.noise_multiplier * self.max_grad_norm / math.sqrt(self.noise_shares)

    def round_events(self) -> list[tuple[Any, int]]:
        return [(poisson_gaussian_event(self.noise_multiplier, self.sample_rate), self.steps)]

    def degraded_round_events(self, contributors: int) -> list[tuple[Any, int]]:
        """Only ``contributors`` clients' noise is in the sum: σ_eff = σ √((contributors − hbc) / shares)."""
        hbc = self.num_clients - self.noise_shares
        trusted = contributors - hbc
        check(trusted >= 1, "contributors", contributors, "leave no trusted noise in the sum")
        sigma = self.noise_multiplier * math.sqrt(
            min(trusted, self.noise_shares) / self.noise_shares
        )
        return [(poisson_gaussian_event(sigma, self.sample_rate), self.steps)]

    def local_events(self) -> list[tuple[Any, int]]:
        local_sigma = self.noise_multiplier / math.sqrt(self.noise_shares)
        return [(poisson_gaussian_event(local_sigma, self.sample_rate), self.steps)]

    def calibrated(self, target_epsilon: float, target_delta: float, num_rounds: int) -> LocalDPSGD:
        sigma = calibrate_noise_multiplier(
            target_epsilon,
            target_delta,
            self.sample_rate,
            self.steps * num_rounds,
            accountant=self.privacy.get("accountant", "pld"),
        )
        return replace(
            self, privacy={**self.privacy, "noise_multiplier": sigma, "target_epsilon": None}
        )

    def train(
        self, model: nn.Module, data: ClientData, ctx: TrainContext
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        sampler = PoissonSampler(self.sample_rate)
        start = {k: p.detach().clone() for k, p in model.named_parameters()}
        params = dict(model.named_parameters())
        velocity = {k: torch.zeros_like(p) for k, p in params.items()}
        expected_batch = max(self.sample_rate * len(data), 1.0)
        empty = 0
        total = 0
        for _ in range(self.steps):
            idx = torch.from_numpy(sampler.sample(len(data), ctx.rng))
            empty += int(idx.numel() == 0)
            total += int(idx.numel())
            x, y = data.x[idx].to(ctx.device), data.y[idx].to(ctx.device)
            sums, _ = clipped_grad_sum(model, summed_cross_entropy, x, y, self.max_grad_norm)
            noisy = add_gaussian_noise(sums, self.local_noise_stddev, ctx.generator)
            with torch.no_grad():
                for k, g in noisy.items():
                    velocity[k].mul_(self.momentum).add_(g / expected_batch)
                    params[k].sub_(self.lr * velocity[k])
        update = {k: (p.detach() - start[k]).cpu() for k, p in params.items()}
        metrics = {
            "steps": float(self.steps),
            "empty_batches": float(empty),
            "examples": float(total),
        }
        return update, metrics
