"""A custom client algorithm and a custom strategy, plugged in from the command line:

    .venv/bin/fedpriv client._target_=examples.plugins.ClippedDeltaDPSGD \
        +client.max_delta_norm=0.5 \
        strategy._target_=examples.plugins.DPFedAvgM strategy.server_momentum=0.9

Both only post-process what is already private, so the privacy events (and ε) are those of
the DP-SGD steps they inherit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from clients.local_dpsgd import LocalDPSGD
from fedpriv.common.errors import check
from fedpriv.data.client_data import ClientData
from fedpriv.mechanisms.clipping import clip_tensors
from fedpriv.run.algorithm import TrainContext
from fedpriv.run.job import ServerJob, State
from strategies.fedavg import DPFedAvg


@dataclass(frozen=True)
class ClippedDeltaDPSGD(LocalDPSGD):
    """Local DP-SGD whose round delta is also clipped to ``max_delta_norm`` (post-processing)."""

    max_delta_norm: float = 5.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.max_delta_norm > 0, "client.max_delta_norm", self.max_delta_norm, "must be > 0")

    def train(
        self, model: nn.Module, data: ClientData, ctx: TrainContext
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        update, metrics = super().train(model, data, ctx)
        clipped = clip_tensors(list(update.values()), self.max_delta_norm)
        return dict(zip(update, clipped, strict=True)), metrics


@dataclass
class DPFedAvgM(DPFedAvg):
    """DP FedAvg with server momentum (FedAvgM, Hsu et al. 2019) on the private mean, written
    as the strategy hook ``aggregate_train`` (the released sum in, the new model out)."""

    server_momentum: float = 0.9
    _velocity: dict[str, np.ndarray] = field(default_factory=dict, repr=False, init=False)

    def aggregate_train(
        self, server_round: int, state: State, total: State, job: ServerJob
    ) -> tuple[State, dict[str, float]]:
        new = dict(state)
        for key, value in total.items():
            v = self.server_momentum * self._velocity.get(key, 0.0) + value / job.mean_divisor
            self._velocity[key] = v
            new[key] = (state[key] + self.server_lr * v).astype(state[key].dtype)
        return new, {}
