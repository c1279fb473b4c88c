"""A plug-in client that fails on purpose, for trying ``round_failure`` (issue 14, item 2).

``.venv/bin/fedpriv client._target_=examples.faulty_client.FaultyDPSGD +client.fail_round=2``:
client ``fail_client`` raises (``fail_mode=raise``), sleeps past ``round_timeout`` (``sleep``) or
sends a non-finite update (``non_finite``) in round ``fail_round``; every other client and round
trains as :class:`clients.local_dpsgd.LocalDPSGD`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from clients.local_dpsgd import LocalDPSGD
from fedpriv.data.client_data import ClientData
from fedpriv.run.algorithm import TrainContext


@dataclass(frozen=True)
class FaultyDPSGD(LocalDPSGD):
    """:class:`~clients.local_dpsgd.LocalDPSGD` whose client ``fail_client`` fails in
    ``fail_round``."""

    fail_round: int = 2
    fail_client: int = 0
    fail_mode: str = "raise"  # raise | sleep | non_finite

    def train(
        self, model: torch.nn.Module, data: ClientData, ctx: TrainContext
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        if ctx.server_round == self.fail_round and data.partition_id == self.fail_client:
            if self.fail_mode == "raise":
                raise ValueError(f"injected failure of client {data.partition_id}")
            if self.fail_mode == "sleep":
                time.sleep(3600)
        update, metrics = super().train(model, data, ctx)
        if ctx.server_round == self.fail_round and data.partition_id == self.fail_client:
            update = {k: torch.full_like(v, math.nan) for k, v in update.items()}
        return update, metrics
