"""Many clients' per-sample clipped gradient sums at once (``torch.func.vmap`` over clients).

A worker's clients share the model's shape; only their parameters and batches differ. Stacking
the parameters on a leading client axis and the batches as ``(k, B, ...)`` (padded, with a
mask), :func:`cohort_clipped_grad_sums` returns every client's ``sum_i [grad_i]_C`` in one
vectorized call: the same per-sample gradients and clip factors as
:func:`fedpriv.persample.reference_clipped_grad_sum` (each tensor's norm in float32, combined in
float64), so each client's sum equals its own sequential one up to float rounding. Padded
samples get factor 0 and add nothing.

References
----------
Abadi et al. (2016), "Deep Learning with Differential Privacy", arXiv:1607.00133, Algorithm 1
(per-sample clipping); torch.func (``vmap``, ``grad``, ``functional_call``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from fedpriv.algorithm import ClientData
from fedpriv.clipping import clip_factor
from fedpriv.ghost import refuse_cross_sample
from fedpriv.persample import LossFn, trainable

#: Leaf modules the vectorized path accepts: dense layers and elementwise activations. Models
#: with others (convolutions, pooling, normalization) keep the sequential per-client path.
DENSE_MODULES = (nn.Linear, nn.Flatten, nn.ReLU, nn.Tanh, nn.Sigmoid, nn.Identity, nn.GELU)

#: Floats of per-sample gradients materialized at once (clients x batch x parameters).
CHUNK_FLOATS = 1 << 25


def dense_model(model: nn.Module) -> bool:
    """Whether every leaf module of ``model`` is in :data:`DENSE_MODULES` (no buffers)."""
    leaves = [m for m in model.modules() if not list(m.children())]
    return all(isinstance(m, DENSE_MODULES) for m in leaves) and not list(model.buffers())


def chunk_size(model: nn.Module, batch: int) -> int:
    """Clients per vectorized call so that ``clients x batch x parameters <= CHUNK_FLOATS``."""
    params = sum(p.numel() for p in trainable(model).values())
    return max(1, CHUNK_FLOATS // max(1, params * max(batch, 1)))


def padded_batches(
    datas: Sequence[ClientData], indices: Sequence[torch.Tensor], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x, y, mask)`` of shapes ``(k, B, *input)``, ``(k, B)``, ``(k, B)``; ``B`` the largest
    batch; client ``j``'s rows ``0..len(indices[j])-1`` hold its samples, the rest zeros."""
    k, width = len(datas), max(int(i.numel()) for i in indices)
    x = torch.zeros((k, width, *datas[0].x.shape[1:]), dtype=datas[0].x.dtype)
    y = torch.zeros((k, width), dtype=datas[0].y.dtype)
    mask = torch.zeros((k, width), dtype=torch.bool)
    for j, (data, idx) in enumerate(zip(datas, indices)):
        b = int(idx.numel())
        x[j, :b], y[j, :b], mask[j, :b] = data.x[idx], data.y[idx], True
    return x.to(device), y.to(device), mask.to(device)


def cohort_clipped_grad_sums(
    model: nn.Module,
    loss_fn: LossFn,
    params: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    mask: torch.Tensor,
    max_grad_norm: float,
) -> dict[str, torch.Tensor]:
    """Per client, the sum over its masked batch of per-sample gradients clipped to C.

    Parameters
    ----------
    model : nn.Module
        Gives the architecture (its own parameters are not used).
    loss_fn : callable
        ``loss_fn(output, target)`` returning the batch's summed loss.
    params : dict[str, torch.Tensor]
        Trainable parameters stacked over clients, each ``(k, *param.shape)``.
    x, y, mask : torch.Tensor
        ``(k, B, *input)``, ``(k, B)``, ``(k, B)`` boolean (from :func:`padded_batches`).
    max_grad_norm : float
        Per-sample clipping norm C (> 0).

    Returns
    -------
    dict[str, torch.Tensor]
        ``(k, *param.shape)`` per parameter.
    """
    refuse_cross_sample(model)
    buffers = {k: b.detach() for k, b in model.named_buffers()}

    def loss_one(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, (p, buffers), (xi.unsqueeze(0),))
        return loss_fn(out, yi.unsqueeze(0))

    per_sample = vmap(grad(loss_one), in_dims=(None, 0, 0))

    def client_sum(
        p: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor, mb: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        grads = per_sample(p, xb, yb)
        sq = sum(
            torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1).double().square()
            for g in grads.values()
        )
        factor = clip_factor(torch.as_tensor(sq).sqrt(), max_grad_norm) * mb
        return {k: torch.einsum("b,b...->...", factor.to(g.dtype), g) for k, g in grads.items()}

    return vmap(client_sum)(params, x, y, mask)
