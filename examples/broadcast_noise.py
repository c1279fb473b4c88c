"""A BROKEN mechanism for the audit to catch (``tests/test_audit.py``, README "Auditing").

:class:`BroadcastNoiseDPSGD` is local DP-SGD whose noise is the noise of the first paper's
public code (van Dijk et al., "Generalizing DP-SGD with Shuffling and Batch Clipping",
arXiv:2212.05796; github.com/MisaNguyen/DPSGD, ``DPSGD_optimizer.py``:
``torch.normal(mean=torch.Tensor([0.0]), std=sigma * C)``): ONE N(0, (σC)²/m) scalar per
parameter tensor per step (m clients: the sum holds N(0, (σC)²)), broadcast over the tensor,
instead of one draw per coordinate. It claims (and is accounted at) the ε of
:class:`clients.dpsgd.LocalDPSGD` with the same σ, but a shift shared by every coordinate of a
tensor hides almost nothing (for a softmax layer it cancels exactly), so ``audit=canaries``
finds an ε lower bound above the claimed ε::

    fedpriv audit=canaries model=logistic privacy.noise_multiplier=5 \
        client._target_=examples.broadcast_noise.BroadcastNoiseDPSGD

Never use it for anything else.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from clients.dpsgd import LocalDPSGD, summed_cross_entropy
from fedpriv.algorithm import ClientData, TrainContext
from fedpriv.errors import check
from fedpriv.persample import clipped_grad_sum
from fedpriv.samplers import PoissonSampler


def broadcast_noise(
    tensors: dict[str, torch.Tensor], stddev: float, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """``tensors`` plus ONE N(0, stddev²) scalar per tensor, broadcast (the bug)."""
    out = {}
    for k, t in tensors.items():
        z = torch.randn((), generator=generator, device=t.device, dtype=t.dtype) * stddev
        out[k] = t + z
    return out


@dataclass(frozen=True)
class BroadcastNoiseDPSGD(LocalDPSGD):
    """:class:`~clients.dpsgd.LocalDPSGD` with one noise scalar per tensor (see the module);
    plain SGD steps (``momentum`` must be 0)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.momentum == 0, "client.momentum", self.momentum, "must be 0 here")

    def train(
        self, model: nn.Module, data: ClientData, ctx: TrainContext
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        normalizer = self.bound_normalizer
        sampler = PoissonSampler(self.sample_rate)
        start = {k: p.detach().clone() for k, p in model.named_parameters()}
        params = dict(model.named_parameters())
        for _ in range(self.steps):
            idx = torch.from_numpy(sampler.sample(len(data), ctx.rng))
            x, y = data.x[idx].to(ctx.device), data.y[idx].to(ctx.device)
            sums, _ = clipped_grad_sum(model, summed_cross_entropy, x, y, self.max_grad_norm)
            noisy = broadcast_noise(sums, self.local_noise_stddev, ctx.generator)
            with torch.no_grad():
                for k, g in noisy.items():
                    params[k].sub_(self.lr * g / normalizer)
        update = {k: (p.detach() - start[k]).cpu() for k, p in params.items()}
        return update, {"steps": float(self.steps), "noise_draws": float(self.steps)}
