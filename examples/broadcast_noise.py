"""A BROKEN mechanism for the audit to catch (``tests/test_audit.py``, docs/auditing.md).

:class:`BroadcastNoiseDPSGD` is local DP-SGD whose noise is the noise of the first paper's
public code (van Dijk et al., "Generalizing DP-SGD with Shuffling and Batch Clipping",
arXiv:2212.05796; github.com/MisaNguyen/DPSGD, ``DPSGD_optimizer.py``:
``torch.normal(mean=torch.Tensor([0.0]), std=sigma * C)``): ONE N(0, (σC)²/m) scalar per
parameter tensor per step (m clients: the sum holds N(0, (σC)²)), broadcast over the tensor,
instead of one draw per coordinate. It claims (and is accounted at) the ε of
:class:`clients.local_dpsgd.LocalDPSGD` with the same σ, but a shift shared by every coordinate of a
tensor hides almost nothing (for a softmax layer it cancels exactly), so ``audit=canaries``
finds an ε lower bound above the claimed ε::

    .venv/bin/fedpriv audit=canaries model=logistic privacy.noise_multiplier=5 \
        client._target_=examples.broadcast_noise.BroadcastNoiseDPSGD

Never use it for anything else.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from clients.local_dpsgd import LocalDPSGD
from fedpriv.data.client_data import ClientData
from fedpriv.run.algorithm import TrainContext


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
    """:class:`~clients.local_dpsgd.LocalDPSGD` with one noise scalar per tensor (see the
    module)."""

    def noise(
        self, sums: dict[str, torch.Tensor], generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        return broadcast_noise(sums, self.local_noise_stddev, generator)

    def train(
        self, model: nn.Module, data: ClientData, ctx: TrainContext
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """LocalDPSGD's steps with :meth:`noise`; defined here so that the vectorized cohort
        path (per-coordinate Gaussian noise) is never used for this class."""
        return super().train(model, data, ctx)
