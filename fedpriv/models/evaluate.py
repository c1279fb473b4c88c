"""Central evaluation of the global model on the held-out test split."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


@torch.no_grad()
def evaluate(
    model: nn.Module, x: np.ndarray, y: np.ndarray, batch_size: int = 1000
) -> tuple[float, float]:
    """``(accuracy, mean cross-entropy loss)`` of ``model`` on ``x`` ``(n, ...)``, ``y``
    ``(n,)``."""
    model.eval()
    device = next(model.parameters()).device
    correct, loss = 0, 0.0
    for i in range(0, len(y), batch_size):
        xb = torch.from_numpy(x[i : i + batch_size]).to(device)
        yb = torch.from_numpy(y[i : i + batch_size]).to(device)
        out = model(xb)
        loss += float(nn.functional.cross_entropy(out, yb, reduction="sum"))
        correct += int((out.argmax(1) == yb).sum())
    model.train()
    return correct / max(len(y), 1), loss / max(len(y), 1)
