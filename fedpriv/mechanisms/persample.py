"""Per-sample clipped gradient sums for DP-SGD.

``clipped_grad_sum`` returns ``sum_i [grad_i]_C`` over a batch, the quantity DP-SGD adds noise
to (Abadi et al. 2016, Algorithm 1). The reference path materializes per-sample gradients
with ``torch.func.vmap(grad(...))``; the book-keeping fast path (``fedpriv.mechanisms.ghost``) is
used when the model allows it and returns the same value up to float rounding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from fedpriv.common.errors import check
from fedpriv.mechanisms.clipping import clip_factor
from fedpriv.mechanisms.ghost import (
    CROSS_SAMPLE_LAYERS,
    ghost_clipped_grad_sum,
    refuse_cross_sample,
)

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def trainable(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's trainable parameters by name, in ``named_parameters`` order."""
    return {k: p for k, p in model.named_parameters() if p.requires_grad}


def per_sample_grads(
    model: nn.Module, loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Per-sample gradients, each of shape ``(B, *param.shape)`` (torch.func reference path).

    ``loss_fn(output, target)`` must return the summed loss of its batch; it is called on a
    batch of one inside ``vmap``.
    """
    params = {k: p.detach() for k, p in trainable(model).items()}
    buffers = {k: b.detach() for k, b in model.named_buffers()}

    def loss_one(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, (p, buffers), (xi.unsqueeze(0),))
        return loss_fn(out, yi.unsqueeze(0))

    grads: dict[str, torch.Tensor] = vmap(grad(loss_one), in_dims=(None, 0, 0))(params, x, y)
    return grads


def clipped_grad_sum(
    model: nn.Module, loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor, max_grad_norm: float
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Sum over the batch of per-sample gradients clipped to ``max_grad_norm``.

    Dispatches to the book-keeping fast path (:mod:`fedpriv.mechanisms.ghost`) when every
    parameterized module is a supported layer (``nn.Linear``, ``nn.Conv2d``) and its runtime
    guards pass; otherwise to :func:`reference_clipped_grad_sum` (torch.func). Both return the
    same value up to float rounding. Parameters and returns as in
    :func:`reference_clipped_grad_sum`.

    Raises
    ------
    ConfigError
        If ``max_grad_norm`` is not > 0, or the model contains BatchNorm (samples are coupled,
        so per-sample clipping would not bound one sample's influence).
    """
    check(max_grad_norm > 0, "max_grad_norm", max_grad_norm, "must be > 0")
    refuse_cross_sample(model)
    if x.shape[0] > 0:
        fast = ghost_clipped_grad_sum(model, loss_fn, x, y, max_grad_norm)
        if fast is not None:
            return fast
    return reference_clipped_grad_sum(model, loss_fn, x, y, max_grad_norm)


def reference_clipped_grad_sum(
    model: nn.Module, loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor, max_grad_norm: float
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Sum over the batch of per-sample gradients clipped to ``max_grad_norm`` (reference path).

    Parameters
    ----------
    model : nn.Module
        The model; its trainable parameters are differentiated.
    loss_fn : callable
        ``loss_fn(output, target)`` returning the batch's summed loss.
    x, y : torch.Tensor
        Inputs ``(B, ...)`` and targets ``(B,)``; ``B = 0`` gives all-zero sums.
    max_grad_norm : float
        Per-sample clipping norm C (> 0).

    Returns
    -------
    (sums, norms)
        ``sums[name]`` has the parameter's shape; ``norms`` has shape ``(B,)`` (unclipped
        per-sample gradient norms).
    """
    params = trainable(model)
    if x.shape[0] == 0:
        zeros = {k: torch.zeros_like(p) for k, p in params.items()}
        return zeros, torch.zeros(0, device=next(iter(params.values())).device)
    sums, norms = clip_and_sum(per_sample_grads(model, loss_fn, x, y), max_grad_norm)
    return sums, norms.to(x.dtype if x.is_floating_point() else torch.float32)


def clip_and_sum(
    grads: dict[str, torch.Tensor], clipping_norm: float
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """``sum_b [g_b]_C`` over the leading axis of stacked gradients ``(B, *param.shape)``;
    also the unclipped norms ``(B,)`` (float64)."""
    first = next(iter(grads.values()))
    sq = torch.zeros(first.shape[0], device=first.device, dtype=torch.float64)
    for g in grads.values():
        sq += g.reshape(g.shape[0], -1).double().pow(2).sum(1)
    norms = sq.sqrt()
    factor = clip_factor(norms, clipping_norm)
    sums = {k: torch.einsum("b,b...->...", factor.to(g.dtype), g) for k, g in grads.items()}
    return sums, norms


def clipped_group_grad_sum(
    model: nn.Module, loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor, clipping_norm: float
) -> dict[str, torch.Tensor] | None:
    """``sum_h [ (1/s) sum_{i in group h} grad f(w; xi_i) ]_C`` for ``m`` groups at once.

    Batch clipping with ``m`` groups of ``s`` records (van Dijk et al., "Generalizing DP-SGD
    with Shuffling and Batch Clipping", arXiv:2212.05796, Algorithm 1 with ``A`` = one gradient
    at ``w``), and augmentation multiplicity's records of ``s`` views (De et al. 2022,
    arXiv:2204.13650, Section 3.1). The book-keeping fast path
    (:func:`fedpriv.mechanisms.ghost.ghost_clipped_grad_sum` with ``views = s``) when the
    model allows it; otherwise one ``torch.func.vmap`` over the groups of the group-mean
    gradient, so the memory holds ``m`` gradients (not ``m s`` per-sample ones).

    Parameters
    ----------
    x, y : torch.Tensor
        Groups ``(m, s, ...)`` and targets ``(m, s)``.
    clipping_norm : float
        C > 0: each group's gradient is clipped to L2 norm C.

    Returns
    -------
    dict[str, torch.Tensor] or None
        The sum per trainable parameter (parameter shapes); ``None`` if the model has a
        BatchNorm layer (its running statistics cannot be updated under ``vmap``: the caller
        then loops over the groups).

    Raises
    ------
    ConfigError
        If ``clipping_norm`` is not > 0.
    """
    check(clipping_norm > 0, "clipping_norm", clipping_norm, "must be > 0")
    if any(isinstance(m, CROSS_SAMPLE_LAYERS) for m in model.modules()):
        return None
    m, s = x.shape[0], x.shape[1]
    if m > 0 and s > 0:
        rows = (x.reshape(m * s, *x.shape[2:]), y.reshape(m * s, *y.shape[2:]))
        fast = ghost_clipped_grad_sum(model, loss_fn, *rows, clipping_norm, views=s)
        if fast is not None:
            return fast[0]
    return reference_group_grad_sum(model, loss_fn, x, y, clipping_norm)


def reference_group_grad_sum(
    model: nn.Module, loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor, clipping_norm: float
) -> dict[str, torch.Tensor]:
    """:func:`clipped_group_grad_sum` by one ``torch.func.vmap`` over the groups ``(m, s, ...)``
    of the group-mean gradient (the reference path; no BatchNorm)."""
    s = x.shape[1]
    params = {k: p.detach() for k, p in trainable(model).items()}
    buffers = {k: b.detach() for k, b in model.named_buffers()}

    def group_loss(p: dict[str, torch.Tensor], xg: torch.Tensor, yg: torch.Tensor) -> torch.Tensor:
        return loss_fn(functional_call(model, (p, buffers), (xg,)), yg) / s

    grads = vmap(grad(group_loss), in_dims=(None, 0, 0), randomness="different")(params, x, y)
    return clip_and_sum(grads, clipping_norm)[0]
