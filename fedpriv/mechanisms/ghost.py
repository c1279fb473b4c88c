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

Supported parameterized layers (rules in :mod:`fedpriv.mechanisms.ghost_rules`): ``nn.Linear``
(any leading dims after the batch), ``nn.Conv2d`` (stride, padding incl. ``"same"`` and
non-zero padding modes, dilation, groups, with or without bias), ``nn.GroupNorm`` and the
weight-standardized :class:`fedpriv.models.cifar.WSConv2d`, matched by exact type. A record may
be several rows (``views``: augmentation multiplicity, batch clipping's groups), its gradient
the mean of theirs. Everything else with parameters makes
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
from torch import nn

from fedpriv.common.errors import ConfigError, check
from fedpriv.mechanisms.clipping import clip_factor
from fedpriv.mechanisms.ghost_rules import RULES, Finish
from fedpriv.models.cifar import WSConv2d

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

SUPPORTED_LAYERS: tuple[type[nn.Module], ...] = tuple(RULES)
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

    The fast path needs every module owning trainable parameters to be exactly one of
    :data:`SUPPORTED_LAYERS` (``nn.Linear``, ``nn.Conv2d``, ``nn.GroupNorm``, ``WSConv2d``),
    every parameterless leaf module to be a known per-sample layer (activations, pooling,
    flatten, dropout; no in-place ones), and no parameter shared between modules.
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


_GRAPH_CHECKED: weakref.WeakKeyDictionary[nn.Module, dict[tuple[object, ...], bool]] = (
    weakref.WeakKeyDictionary()
)
"""Per model and input signature: does every trainable parameter have one autograd edge?"""


def _edge_counts(out: torch.Tensor) -> dict[int, int]:
    """For each leaf tensor (by id) in ``out``'s autograd graph: how many nodes use it."""
    counts: dict[int, int] = {}
    seen: set[int] = set()
    stack = [out.grad_fn]
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
    return counts


def _params_used_once(loss: torch.Tensor, layers: list[nn.Module]) -> bool:
    """Whether each trainable parameter is used in ``loss``'s graph only by its own layer's
    call: one edge, or for a weight-standardized kernel the edges of its standardization."""
    counts = _edge_counts(loss)
    for m in layers:
        expected = {id(p): 1 for p in m.parameters(recurse=False) if p.requires_grad}
        if type(m) is WSConv2d and m.weight.requires_grad:
            with torch.enable_grad():
                expected[id(m.weight)] = _edge_counts(m.standardized_weight())[id(m.weight)]
        if any(counts.get(k, 0) != n for k, n in expected.items()):
            return False
    return True


def _recorded_forward(
    model: nn.Module, layers: list[nn.Module], loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, list[_Record]] | None:
    """The summed loss and one record per supported layer, or ``None`` if a layer was called
    other than once or saw an input it has no rule for."""
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
    rows = x.shape[0]
    if any(calls.get(id(m), 0) != 1 for m in layers) or any(
        r.a.dim() < 2
        or r.a.shape[0] != rows
        or r.z.shape[0] != rows
        or (isinstance(r.module, nn.GroupNorm) and r.z.shape != r.a.shape)
        or not r.z.requires_grad
        or (isinstance(r.module, nn.Conv2d) and r.a.dim() != 4)
        for r in records
    ):
        return None
    return loss, records


def ghost_clipped_grad_sum(
    model: nn.Module,
    loss_fn: LossFn,
    x: torch.Tensor,
    y: torch.Tensor,
    max_grad_norm: float,
    views: int = 1,
) -> tuple[dict[str, torch.Tensor], torch.Tensor] | None:
    """Fast ``sum_i [g_i]_C`` by book-keeping, or ``None`` if a runtime guard fails.

    Returns ``None`` (the caller then uses the reference path) when :func:`fast_path_blocker`
    names a reason or a runtime guard fails. ``B`` must be > 0.

    Parameters
    ----------
    model : nn.Module
        Batch-first model made of supported layers.
    loss_fn : callable
        ``loss_fn(output, target)`` returning the batch's *summed* loss.
    x, y : torch.Tensor
        Inputs ``(B k, ...)``, targets ``(B k, ...)``, record-major: rows ``i k .. i k + k - 1``
        are record ``i``'s ``k`` views.
    max_grad_norm : float
        Per-record clipping norm C (> 0).
    views : int
        ``k`` >= 1 (else ``ConfigError``): record ``i``'s gradient ``g_i`` is the mean of
        its ``k`` rows' gradients (augmentation multiplicity, De et al. 2022,
        arXiv:2204.13650; or a group of batch clipping, arXiv:2212.05796), clipped after
        averaging.

    Returns
    -------
    (sums, norms) or None
        ``sums[name]`` has the parameter's shape; ``norms`` ``(B,)`` are the unclipped
        per-record gradient norms (over all trainable parameters).
    """
    check(
        isinstance(views, int) and not isinstance(views, bool) and views >= 1,
        "views",
        views,
        "must be an integer >= 1 (rows per record)",
    )
    blocker, layers, params = _scan(model)
    if blocker is not None or x.shape[0] % views:
        return None
    recorded = _recorded_forward(model, layers, loss_fn, x, y)
    if recorded is None:
        return None
    loss, records = recorded
    key = (tuple(x.shape[1:]), x.dtype, model.training)
    checked = _GRAPH_CHECKED.setdefault(model, {})
    if key not in checked:
        checked[key] = _params_used_once(loss, layers)
    if not checked[key]:
        return None
    with torch.enable_grad():
        out_grads = torch.autograd.grad(loss, [r.z for r in records], allow_unused=True)
    if any(r.a._version != r.a_version or r.z._version != r.z_version for r in records):
        return None
    rules: list[tuple[nn.Module, Finish]] = []
    sq: torch.Tensor | None = None
    for r, b in zip(records, out_grads, strict=True):
        mod = r.module
        weight = mod.weight
        assert isinstance(weight, torch.Tensor)  # every supported layer has a weight
        dtype = weight.dtype  # e.g. fp16 activations under autocast: norms in fp32
        g = torch.zeros_like(r.z, dtype=dtype) if b is None else b.to(dtype)
        g = g / views if views > 1 else g
        s, finish = RULES[type(mod)](mod, r.a.to(dtype), r.z.to(dtype), g, views)
        sq = s if sq is None else sq.add_(s)
        rules.append((mod, finish))
    bsz = x.shape[0] // views
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
            if total is not None and isinstance(p, torch.Tensor):
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
