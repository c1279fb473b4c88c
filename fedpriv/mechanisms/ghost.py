"""Book-keeping per-sample clipping: clipped gradient sums without per-sample weight gradients.

One forward pass records each supported layer's input ``a`` and output ``z``; one backward pass
computes only the output gradients ``b = dL/dz`` (``L`` = summed loss, so ``b_i`` is sample
``i``'s own output gradient) and no weight gradient at all. From ``(a, b)`` each layer gives

* the per-sample squared gradient norms, without materializing per-sample gradients where
  that is cheaper ("ghost norm": Goodfellow 2015; Li et al. 2022; Bu et al. 2023):
  a linear layer without sequence dims has ``||b_i a_i^T||^2 = ||a_i||^2 ||b_i||^2``; with a
  sequence (or conv-patch) dim of length T, ``||a_i^T b_i||_F^2 = <a_i a_i^T, b_i b_i^T>``
  (cost ``T^2 (d + p)``), or the direct per-sample gradient (cost ``T d p``), whichever is
  cheaper (Bu et al. 2023's layerwise decision);
* the clipped sum ``sum_i c_i b_i^T a_i`` with ``c_i = min(1, C / ||g_i||)`` as one matrix
  product of the reweighted output gradients with the stored inputs ("book-keeping",
  Bu et al. 2023), so no second backward pass is needed.

Supported parameterized layers: ``nn.Linear`` (any leading dims after the batch) and
``nn.Conv2d`` (stride, padding incl. ``"same"`` and non-zero padding modes, dilation, groups,
with or without bias), matched by exact type. Everything else with parameters makes
:func:`fast_path_blocker` return a reason, and :func:`fedpriv.mechanisms.persample.clipped_grad_sum`
then uses the exact torch.func reference path.

Assumptions (shared with Opacus): the model is batch-first and treats samples independently
outside the supported layers, and ``loss_fn`` returns the *sum* of per-sample losses. Runtime
guards fall back to the reference path when a supported layer is called other than once, when
its input or output is modified in place, or when a parameter is used outside its own layer.

References
----------
Goodfellow, "Efficient per-example gradient computations", arXiv:1510.01799 (2015).
Li, Tramèr, Liang, Hashimoto, "Large language models can be strong differentially private
learners", ICLR 2022 (ghost clipping).
Bu, Wang, Zha, Karypis, "Differentially private optimization on large model at small cost",
ICML 2023, PMLR 202:3192-3218 (book-keeping, layerwise decision).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fedpriv.common.errors import ConfigError
from fedpriv.mechanisms.clipping import clip_factor

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

SUPPORTED_LAYERS: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv2d)
"""Parameterized layers with a fast rule (matched by exact type, not subclass)."""

SAFE_PARAMETERLESS: tuple[type[nn.Module], ...] = (
    nn.Identity,
    nn.Flatten,
    nn.Unflatten,
    nn.Tanh,
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.ELU,
    nn.SELU,
    nn.CELU,
    nn.GELU,
    nn.SiLU,
    nn.Mish,
    nn.Sigmoid,
    nn.Hardtanh,
    nn.Hardsigmoid,
    nn.Hardswish,
    nn.Softplus,
    nn.Softsign,
    nn.Tanhshrink,
    nn.LogSigmoid,
    nn.Softmax,
    nn.LogSoftmax,
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.MaxPool3d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AvgPool3d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d,
    nn.AdaptiveMaxPool3d,
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.Sequential,
    nn.ModuleList,
    nn.ModuleDict,
)
"""Parameterless leaf layers known to act on each sample separately (exact types)."""

FROZEN_PER_SAMPLE: tuple[type[nn.Module], ...] = (
    nn.Linear,
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.Embedding,
)
"""Layers acting on each sample separately that may appear with all parameters frozen."""

CROSS_SAMPLE_LAYERS: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._BatchNorm,
    nn.SyncBatchNorm,
)
"""Layers whose output for one sample depends on the other samples of the batch."""


def refuse_cross_sample(model: nn.Module) -> None:
    """Raise if ``model`` contains a BatchNorm layer (per-sample clipping is then not DP).

    Raises
    ------
    ConfigError
        Naming the first BatchNorm module found. BatchNorm couples the samples of a batch, so
        clipping "per-sample" gradients no longer bounds one sample's influence on the sum
        (the per-example clipping of Abadi et al. 2016, Alg. 1, assumes each example's gradient
        depends on that example alone); use GroupNorm/LayerNorm, or batch clipping, which the
        analysis of van Dijk et al., "Generalizing DP-SGD with Shuffling and Batch Clipping",
        arXiv:2212.05796 covers (Algorithm 1 with m = 1).
    """
    if not any(isinstance(m, CROSS_SAMPLE_LAYERS) for m in model.modules()):
        return
    for name, m in model.named_modules():
        if isinstance(m, CROSS_SAMPLE_LAYERS):
            raise ConfigError(
                f"model.{name or '<root>'}",
                type(m).__name__,
                "mixes samples of a batch: per-sample clipping with BatchNorm is not DP; "
                "use GroupNorm/LayerNorm or batch clipping",
            )


def _safe_parameterless(m: nn.Module) -> bool:
    """Whether a leaf without trainable parameters is known to keep samples separate."""
    if getattr(m, "inplace", False):
        return False
    if any(True for _ in m.parameters(recurse=False)):  # all frozen (no trainable ones)
        return type(m) in FROZEN_PER_SAMPLE
    if isinstance(m, (nn.Softmax, nn.LogSoftmax)):
        return m.dim is not None and m.dim >= 1
    if isinstance(m, nn.Flatten):
        return m.start_dim >= 1
    if isinstance(m, nn.Unflatten):
        return isinstance(m.dim, int) and m.dim >= 1
    return type(m) in SAFE_PARAMETERLESS


def _scan(model: nn.Module) -> tuple[str | None, list[nn.Module], dict[str, torch.Tensor]]:
    """One walk over the model: (blocker or None, supported layers to hook, trainable params)."""
    owners: set[int] = set()
    layers: list[nn.Module] = []
    params: dict[str, torch.Tensor] = {}
    for prefix, m in model.named_modules():
        own = [(n, p) for n, p in m._parameters.items() if p is not None and p.requires_grad]
        if own:
            if type(m) not in SUPPORTED_LAYERS:
                return (
                    f"{prefix or '<root>'}: {type(m).__name__} has trainable parameters "
                    "and no fast rule",
                    [],
                    {},
                )
            for n, p in own:
                if id(p) in owners:
                    return (
                        f"{prefix}: {type(m).__name__} shares a parameter with another module",
                        [],
                        {},
                    )
                owners.add(id(p))
                params[f"{prefix}.{n}" if prefix else n] = p
            layers.append(m)
        elif not m._modules and not _safe_parameterless(m):
            return (
                f"{prefix or '<root>'}: {type(m).__name__} is not a known per-sample layer",
                [],
                {},
            )
    return None, layers, params


def fast_path_blocker(model: nn.Module) -> str | None:
    """Why ``model`` cannot use the fast path, or ``None`` if it can.

    The fast path needs every module owning trainable parameters to be exactly ``nn.Linear``
    or ``nn.Conv2d``, every parameterless leaf module to be a known per-sample layer
    (activations, pooling, flatten, dropout; no in-place ones), and no parameter shared
    between modules.
    """
    return _scan(model)[0]


@dataclass
class _Record:
    """One call of a supported layer: its input, output and their autograd versions."""

    module: nn.Module
    a: torch.Tensor
    z: torch.Tensor
    a_version: int
    z_version: int


def _linear_rule(
    m: nn.Linear, a: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, Callable[[torch.Tensor], list[torch.Tensor | None]]]:
    """Per-sample squared norms ``(B,)`` and a finisher ``c -> [weight_sum, bias_sum]``.

    ``a``: input ``(B, ..., d)``; ``b``: output gradient ``(B, ..., p)``.
    """
    want_w = m.weight.requires_grad
    want_b = m.bias is not None and m.bias.requires_grad
    bsz, d, p = a.shape[0], a.shape[-1], b.shape[-1]
    if a.dim() == 2:  # ||b_i a_i^T||^2 = ||a_i||^2 ||b_i||^2, bias: ||b_i||^2
        bb = torch.linalg.vector_norm(b, dim=1).square_()
        if want_w:
            aa = torch.linalg.vector_norm(a, dim=1).square_()
            sq = bb.mul_(aa.add_(1.0)) if want_b else bb.mul_(aa)
        else:
            sq = bb

        def finish(c: torch.Tensor) -> list[torch.Tensor | None]:
            cb = b * c.unsqueeze(1)
            return [cb.t().mm(a) if want_w else None, cb.sum(0) if want_b else None]

        return sq, finish
    a3, b3 = a.reshape(bsz, -1, d), b.reshape(bsz, -1, p)
    t = a3.shape[1]
    sq = torch.zeros(bsz, dtype=a.dtype, device=a.device)
    per_sample: torch.Tensor | None = None
    if want_w:
        if t * (d + p) < d * p:  # Gram trick cheaper than the per-sample gradient
            gram = torch.bmm(a3, a3.transpose(1, 2)) * torch.bmm(b3, b3.transpose(1, 2))
            sq = sq + gram.sum((1, 2)).clamp_min(0.0)  # >= 0 exactly; rounding may dip below
        else:
            per_sample = torch.bmm(b3.transpose(1, 2), a3)  # (B, p, d)
            sq = sq + torch.linalg.vector_norm(per_sample.reshape(bsz, -1), dim=1).square()
    bsum = b3.sum(1) if want_b else None
    if bsum is not None:
        sq = sq + (bsum * bsum).sum(1)

    def finish_seq(c: torch.Tensor) -> list[torch.Tensor | None]:
        w = None
        if want_w:
            if per_sample is not None:
                w = c.unsqueeze(0).mm(per_sample.reshape(bsz, -1)).reshape(p, d)
            else:
                w = (b3 * c.view(-1, 1, 1)).reshape(-1, p).t().mm(a3.reshape(-1, d))
        return [w, c.unsqueeze(0).mm(bsum).squeeze(0) if bsum is not None else None]

    return sq, finish_seq


def _padded_input(m: nn.Conv2d, a: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
    """The conv input with its padding applied explicitly when the layer's padding needs it.

    Returns the (possibly padded) input and the padding still to apply (zero-padding only).
    """
    if m.padding_mode != "zeros" or isinstance(m.padding, str):
        mode = "constant" if m.padding_mode == "zeros" else m.padding_mode
        return F.pad(a, m._reversed_padding_repeated_twice, mode=mode), (0, 0)
    return a, (int(m.padding[0]), int(m.padding[1]))


def _conv2d_per_sample(m: nn.Conv2d, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-sample conv weight gradients ``(B, C_out, k_h, k_w, C_in/g)`` (channels last).

    The input is turned channels-last, its patches are taken as one strided view (runs of
    ``k_w * C_in`` contiguous floats, 2x faster to copy on CPU than ``F.unfold``'s layout),
    and one batched matrix product with the output gradients gives every sample's gradient.
    """
    bsz, c_in, g, c_out = a.shape[0], m.in_channels, m.groups, m.out_channels
    a, pad = _padded_input(m, a)
    if pad != (0, 0):
        a = F.pad(a, (pad[1], pad[1], pad[0], pad[0]))
    a = a.permute(0, 2, 3, 1).contiguous()  # (B, H, W, C_in)
    kh, kw = m.kernel_size
    (sh, sw), (dh, dw) = m.stride, m.dilation
    ho, wo, cg = b.shape[2], b.shape[3], c_in // g
    st = a.stride()
    view = a.as_strided(
        (bsz, g, ho, wo, kh, kw, cg),
        (st[0], cg * st[3], st[1] * sh, st[2] * sw, st[1] * dh, st[2] * dw, st[3]),
    )
    patches = view.reshape(bsz, g, ho * wo, kh * kw * cg)
    per = torch.matmul(b.reshape(bsz, g, c_out // g, ho * wo), patches)  # (B, g, pg, kh kw cg)
    return per.reshape(bsz, c_out, kh, kw, cg)


def _conv2d_rule(
    m: nn.Conv2d, a: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, Callable[[torch.Tensor], list[torch.Tensor | None]]]:
    """Per-sample squared norms ``(B,)`` and a finisher for a 2-d convolution.

    ``a``: input ``(B, C_in, H, W)``; ``b``: output gradient ``(B, C_out, H_out, W_out)``. Per
    group the per-sample weight gradient is ``b_i u_i^T`` with ``u_i`` the ``(D, L)`` unfolded
    input patches, i.e. a linear layer with ``T = L`` positions: the Gram trick costs
    ``L^2 (D + P)`` per sample and group, the direct gradient ``L D P``; the Gram trick is used
    only when it costs under half the direct one (it also pays for copying the patches).
    """
    want_w = m.weight.requires_grad
    want_b = m.bias is not None and m.bias.requires_grad
    bsz, g, c_out = a.shape[0], m.groups, m.out_channels
    b3 = b.reshape(bsz, c_out, -1)  # (B, C_out, L)
    n_pos = b3.shape[-1]
    dg, pg = (m.in_channels // g) * m.kernel_size[0] * m.kernel_size[1], c_out // g
    sq = torch.zeros(bsz, dtype=a.dtype, device=a.device)
    per_sample: torch.Tensor | None = None
    patches: torch.Tensor | None = None
    if want_w:
        if 2 * n_pos * n_pos * (dg + pg) < n_pos * dg * pg:  # Gram trick
            a_pad, pad = _padded_input(m, a)
            u = F.unfold(a_pad, m.kernel_size, dilation=m.dilation, padding=pad, stride=m.stride)
            if u.shape[-1] != n_pos:
                raise RuntimeError("conv patch count does not match the output size")
            patches = u.reshape(bsz, g, dg, n_pos)
            b4 = b3.reshape(bsz, g, pg, n_pos)
            gram_a = torch.matmul(patches.transpose(2, 3), patches)
            gram_b = torch.matmul(b4.transpose(2, 3), b4)
            sq = sq + (gram_a * gram_b).sum((1, 2, 3)).clamp_min(0.0)
        else:
            per_sample = _conv2d_per_sample(m, a, b).reshape(bsz, -1)
            sq = sq + torch.linalg.vector_norm(per_sample, dim=1).square()
    bsum = b3.sum(2) if want_b else None
    if bsum is not None:
        sq = sq + (bsum * bsum).sum(1)

    def finish(c: torch.Tensor) -> list[torch.Tensor | None]:
        w = None
        if per_sample is not None:
            kh, kw = m.kernel_size
            w = c.unsqueeze(0).mm(per_sample).reshape(c_out, kh, kw, -1).permute(0, 3, 1, 2)
        elif patches is not None:
            cb = b3.reshape(bsz, g, pg, n_pos) * c.view(-1, 1, 1, 1)
            w = torch.einsum("bgpl,bgdl->gpd", cb, patches).reshape(m.weight.shape)
        return [w, c.unsqueeze(0).mm(bsum).squeeze(0) if bsum is not None else None]

    return sq, finish


_GRAPH_CHECKED: weakref.WeakKeyDictionary[nn.Module, dict[tuple[object, ...], bool]] = (
    weakref.WeakKeyDictionary()
)
"""Per model and input signature: does every trainable parameter have one autograd edge?"""


def _params_used_once(loss: torch.Tensor, params: list[torch.Tensor]) -> bool:
    """Whether each parameter has exactly one edge in ``loss``'s autograd graph."""
    counts: dict[int, int] = {}
    seen: set[int] = set()
    stack = [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for nxt, _ in node.next_functions:
            if nxt is None:
                continue
            var = getattr(nxt, "variable", None)
            if var is not None:
                counts[id(var)] = counts.get(id(var), 0) + 1
            stack.append(nxt)
    return all(counts.get(id(p), 0) == 1 for p in params)


def ghost_clipped_grad_sum(
    model: nn.Module, loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor, max_grad_norm: float
) -> tuple[dict[str, torch.Tensor], torch.Tensor] | None:
    """Fast ``sum_i [grad_i]_C`` by book-keeping, or ``None`` if a runtime guard fails.

    Returns ``None`` (the caller then uses the reference path) when :func:`fast_path_blocker`
    names a reason or a runtime guard fails. ``B`` must be > 0.

    Parameters
    ----------
    model : nn.Module
        Batch-first model made of supported layers.
    loss_fn : callable
        ``loss_fn(output, target)`` returning the batch's *summed* loss.
    x, y : torch.Tensor
        Inputs ``(B, ...)``, targets ``(B, ...)``.
    max_grad_norm : float
        Per-sample clipping norm C (> 0).

    Returns
    -------
    (sums, norms) or None
        ``sums[name]`` has the parameter's shape; ``norms`` ``(B,)`` are the unclipped
        per-sample gradient norms (over all trainable parameters).
    """
    blocker, layers, params = _scan(model)
    if blocker is not None:
        return None
    records: list[_Record] = []
    calls: dict[int, int] = {}

    def hook(mod: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        calls[id(mod)] = calls.get(id(mod), 0) + 1
        a = args[0]
        records.append(_Record(mod, a.detach(), out, a._version, out._version))

    handles = [m.register_forward_hook(hook) for m in layers]
    try:
        with torch.enable_grad():
            loss = loss_fn(model(x), y)
    finally:
        for h in handles:
            h.remove()
    bsz = x.shape[0]
    if any(calls.get(id(m), 0) != 1 for m in layers) or any(
        r.a.dim() < 2
        or r.a.shape[0] != bsz
        or r.z.shape[0] != bsz
        or not r.z.requires_grad
        or (type(r.module) is nn.Conv2d and r.a.dim() != 4)
        for r in records
    ):
        return None
    key = (tuple(x.shape[1:]), x.dtype, model.training)
    checked = _GRAPH_CHECKED.setdefault(model, {})
    if key not in checked:
        checked[key] = _params_used_once(loss, list(params.values()))
    if not checked[key]:
        return None
    with torch.enable_grad():
        out_grads = torch.autograd.grad(loss, [r.z for r in records], allow_unused=True)
    if any(r.a._version != r.a_version or r.z._version != r.z_version for r in records):
        return None
    rules: list[tuple[nn.Module, Callable[[torch.Tensor], list[torch.Tensor | None]]]]
    rules = []
    sq: torch.Tensor | None = None
    for r, b in zip(records, out_grads, strict=True):
        if b is None:
            b = torch.zeros_like(r.z)
        mod = r.module
        assert isinstance(mod, nn.Linear | nn.Conv2d)  # _scan hooks exactly these types only
        dtype = mod.weight.dtype  # e.g. fp16 activations under autocast: norms in fp32
        a, g = r.a.to(dtype), b.to(dtype)
        if isinstance(mod, nn.Linear):
            s, finish = _linear_rule(mod, a, g)
        else:
            s, finish = _conv2d_rule(mod, a, g)
        sq = s if sq is None else sq.add_(s)
        rules.append((mod, finish))
    if sq is None:  # no supported layer with trainable parameters
        sq = torch.zeros(
            bsz, dtype=x.dtype if x.is_floating_point() else torch.float32, device=x.device
        )
    norms = sq.sqrt()
    c = norms.clamp_min(1e-30).reciprocal_().mul_(max_grad_norm).clamp_max_(1.0)  # clip_factor
    by_id = {id(p): k for k, p in params.items()}
    sums: dict[str, torch.Tensor] = {}
    for m, finish in rules:
        for p, total in zip((m.weight, m.bias), finish(c), strict=True):
            if total is not None and p is not None:
                sums[by_id[id(p)]] = total
    return {k: sums[k] if k in sums else torch.zeros_like(p) for k, p in params.items()}, norms


def batch_clipped_grad(
    model: nn.Module, loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor, clipping_norm: float
) -> dict[str, torch.Tensor]:
    """One mini-batch gradient of the mean loss at ``w``, clipped as a whole (batch clipping).

    ``a = [ (1/s) sum_{i in S_b} grad f(w; xi_i) ]_C`` — the "batch clipping of a mini-batch"
    of van Dijk et al., "Generalizing DP-SGD with Shuffling and Batch Clipping",
    arXiv:2212.05796 (Algorithm 1 with m = 1 group of s = B samples and A = one gradient at
    w). No per-sample gradient is needed, and BatchNorm is allowed (the analysis covers any
    function of the group).

    Parameters
    ----------
    model : nn.Module
        The model; its trainable parameters are differentiated.
    loss_fn : callable
        ``loss_fn(output, target)`` returning the batch's *summed* loss (divided by B here).
    x, y : torch.Tensor
        Inputs ``(B, ...)`` and targets; ``B = 0`` gives all-zero gradients.
    clipping_norm : float
        C > 0; the L2 norm of the concatenated result is at most C.

    Returns
    -------
    dict[str, torch.Tensor]
        The clipped gradient per trainable parameter name (parameter shapes).

    Raises
    ------
    ConfigError
        If ``clipping_norm`` is not > 0.
    """
    if not clipping_norm > 0:
        raise ConfigError("clipping_norm", clipping_norm, "must be > 0")
    params = {k: p for k, p in model.named_parameters() if p.requires_grad}
    if x.shape[0] == 0:
        return {k: torch.zeros_like(p) for k, p in params.items()}
    loss = loss_fn(model(x), y) / x.shape[0]
    grads = list(torch.autograd.grad(loss, list(params.values()), allow_unused=True))
    grads = [
        torch.zeros_like(p) if g is None else g for g, p in zip(grads, params.values(), strict=True)
    ]
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, clip_factor(norm, clipping_norm))
    return dict(zip(params, grads, strict=True))
