"""A client's local data, as the client algorithms and the per-sample machinery take it."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ClientData:
    """A client's local data: ``x`` of shape ``(n, *input_shape)`` float32, ``y`` ``(n,)`` int64,
    and its id ``partition_id`` (the client's index in ``0..num_clients-1``)."""

    x: torch.Tensor
    y: torch.Tensor
    partition_id: int

    def __len__(self) -> int:
        return int(self.x.shape[0])
