"""Per-layer rules of the book-keeping fast path (:mod:`fedpriv.mechanisms.ghost`).

A rule gets one supported layer's recorded input ``a``, output ``z`` and output gradient
``b = dL/dz`` (rows of the batch first) and returns each record's squared gradient norm over
the layer's trainable parameters, ``(B,)``, and a finisher ``c -> [weight_sum, bias_sum]``
giving ``sum_i c_i g_i`` for clip factors ``c`` ``(B,)``.

**Views.** With ``views = k > 1`` the rows are ``B`` records of ``k`` rows each, record-major
(row ``i k + v`` is view ``v`` of record ``i``), and a record's gradient is the sum of its rows'
gradients (the driver scales ``b`` by ``1/k`` for the mean). A record's ``k`` views are then
``k`` times the positions of one row: augmentation multiplicity (De et al. 2022,
arXiv:2204.13650, Section 3.1) and batch clipping's groups (van Dijk et al.,
arXiv:2212.05796, Algorithm 1) both clip such a per-record sum.

Layers (matched by exact type):

* ``nn.Linear`` and ``nn.Conv2d``: per-record gradient ``b_i^T u_i`` over ``T`` positions (conv:
  unfolded patches ``u``); the squared norm by the Gram trick ``<u_i u_i^T, b_i b_i^T>``
  (cost ``T^2 (d + p)``) or from the gradient itself (cost ``T d p``), whichever is cheaper
  (Bu et al., ICML 2023, PMLR 202:3192-3218, layerwise decision; Goodfellow,
  arXiv:1510.01799; Li et al., ICLR 2022).
* ``nn.GroupNorm`` (affine): ``g_gamma = sum_pos b * xhat``, ``g_beta = sum_pos b`` per channel,
  ``xhat`` the normalized input recomputed from ``a``.
* :class:`fedpriv.models.cifar.WSConv2d` (Qiao et al. 2019, arXiv:1903.10520): the kernel used
  is ``w_hat = (w - mean) / s`` per output channel, ``s = sqrt(var + eps)``, over its
  ``n`` fan-in weights. With ``G`` the gradient for ``w_hat``, the gradient for ``w`` is
  ``(1/s) P G``, ``P = I - 1 1^T / n - w_hat w_hat^T / n`` (the Jacobian of the
  standardization, symmetric), and ``||P G||^2 = ||G||^2 - (1^T G)^2 / n
  - (2 - rho) (w_hat^T G)^2 / n`` with ``rho = ||w_hat||^2 / n = var / (var + eps)``. Per
  record and channel ``1^T G = sum_pos b * (patch sums of a)`` and ``w_hat^T G = sum_pos b *
  (z - bias)``, so no per-record gradient is needed for the correction, and the finisher
  applies ``(1/s) P`` once to the clipped sum.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.grad import conv2d_weight

from fedpriv.models.cifar import WSConv2d

Finish = Callable[[torch.Tensor], list[torch.Tensor | None]]
Rule = tuple[torch.Tensor, Finish]


def _wants(m: nn.Module) -> tuple[bool, bool]:
    """Whether the layer's weight and bias are trainable."""
    w, b = getattr(m, "weight", None), getattr(m, "bias", None)
    return (w is not None and w.requires_grad, b is not None and b.requires_grad)


def linear_rule(
    m: nn.Linear, a: torch.Tensor, z: torch.Tensor, b: torch.Tensor, views: int
) -> Rule:
    """``a``: input ``(B k, ..., d)``; ``b``: output gradient ``(B k, ..., p)``."""
    want_w, want_b = _wants(m)
    d, p = a.shape[-1], b.shape[-1]
    bsz = a.shape[0] // views
    if a.dim() == 2 and views == 1:  # ||b_i a_i^T||^2 = ||a_i||^2 ||b_i||^2, bias: ||b_i||^2
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


def padded_input(m: nn.Conv2d, a: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
    """The conv input with its padding applied explicitly when the layer's padding needs it.

    Returns the (possibly padded) input and the padding still to apply (zero-padding only).
    """
    if m.padding_mode != "zeros" or isinstance(m.padding, str):
        mode = "constant" if m.padding_mode == "zeros" else m.padding_mode
        return F.pad(a, m._reversed_padding_repeated_twice, mode=mode), (0, 0)
    return a, (int(m.padding[0]), int(m.padding[1]))


def _record_major(t: torch.Tensor, bsz: int, views: int, lead: int) -> torch.Tensor:
    """``(B k, d_1..d_lead, L, ...)`` -> ``(B, d_1..d_lead, k L, ...)``: a record's views as
    more positions (axis ``lead + 1`` of a row holds the positions)."""
    if views == 1:
        return t
    shape = t.shape[1:]
    t = t.reshape(bsz, views, *shape).movedim(1, lead + 1)
    return t.reshape(bsz, *shape[:lead], views * shape[lead], *shape[lead + 1 :])


def _conv2d_per_sample(
    m: nn.Conv2d, a: torch.Tensor, b4: torch.Tensor, views: int, out_hw: tuple[int, int]
) -> torch.Tensor:
    """Per-record conv weight gradients ``(B, C_out, C_in/g, k_h, k_w)`` (a strided view).

    ``b4``: output gradients ``(B, g, C_out/g, k L)``. The input is turned channels-last, its
    patches are taken as one strided view (runs of ``k_w * C_in`` contiguous floats, 2x faster
    to copy on CPU than ``F.unfold``'s layout), and one batched matrix product with the output
    gradients gives every record's gradient. With large outputs (``H_out W_out >=``
    :data:`GROUPED_MIN_POSITIONS`) the patches are not copied: one grouped convolution
    backward (a group per record) gives the same gradients.
    """
    if out_hw[0] * out_hw[1] >= GROUPED_MIN_POSITIONS:
        return _conv2d_grouped_per_sample(m, a, b4, views, out_hw)
    rows, c_in, g, c_out = a.shape[0], m.in_channels, m.groups, m.out_channels
    a, pad = padded_input(m, a)
    if pad != (0, 0):
        a = F.pad(a, (pad[1], pad[1], pad[0], pad[0]))
    a = a.permute(0, 2, 3, 1).contiguous()  # (B k, H, W, C_in)
    kh, kw = m.kernel_size
    (sh, sw), (dh, dw) = m.stride, m.dilation
    (ho, wo), cg = out_hw, c_in // g
    n_pos = ho * wo
    st, bsz = a.stride(), rows // views
    view = a.as_strided(  # (B, g, k, H_out, W_out, k_h, k_w, C_in/g): one copy on reshape
        (bsz, g, views, ho, wo, kh, kw, cg),
        (views * st[0], cg * st[3], st[0], st[1] * sh, st[2] * sw, st[1] * dh, st[2] * dw, st[3]),
    )
    patches = view.reshape(bsz, g, views * n_pos, kh * kw * cg)
    per = torch.matmul(b4, patches)  # (B, g, pg, kh kw cg)
    return per.reshape(b4.shape[0], c_out, kh, kw, cg).permute(0, 1, 4, 2, 3)


GROUPED_MIN_POSITIONS = 256
"""Output positions (per view) from which a grouped convolution backward is used for per-record conv
gradients instead of copying patches: on CPU it was 1.3-2.7x faster from 16 x 16 outputs and
2-3x slower at 8 x 8 (``torch.nn.grad.conv2d_weight``, oneDNN, torch 2.13, 2 cores)."""


def _conv2d_grouped_per_sample(
    m: nn.Conv2d, a: torch.Tensor, b4: torch.Tensor, views: int, out_hw: tuple[int, int]
) -> torch.Tensor:
    """:func:`_conv2d_per_sample` as one convolution weight-gradient with ``B g`` groups: the
    records go to the channel axis and the views to the batch axis, so the conv's sum over its
    batch is each record's sum over its views."""
    rows, c_in, c_out = a.shape[0], m.in_channels, m.out_channels
    bsz = rows // views
    a, pad = padded_input(m, a)
    a = a.reshape(bsz, views, *a.shape[1:]).transpose(0, 1).reshape(views, bsz * c_in, *a.shape[2:])
    b = b4.reshape(bsz, c_out, views, *out_hw).permute(2, 0, 1, 3, 4)
    b = b.reshape(views, bsz * c_out, *out_hw)
    shape = (bsz * c_out, c_in // m.groups, *m.kernel_size)
    per: torch.Tensor = conv2d_weight(  # type: ignore[no-untyped-call]  # torch's own helper
        a, shape, b, m.stride, pad, m.dilation, bsz * m.groups
    )
    return per.reshape(bsz, *m.weight.shape)


def conv2d_rule(
    m: nn.Conv2d,
    a: torch.Tensor,
    z: torch.Tensor,
    b: torch.Tensor,
    views: int,
    weight_scale: torch.Tensor | None = None,
) -> Rule:
    """Per-record squared norms ``(B,)`` and a finisher for a 2-d convolution.

    ``a``: input ``(B k, C_in, H, W)``; ``b``: output gradient ``(B k, C_out, H_out, W_out)``.
    Per group the per-record weight gradient is ``b_i u_i^T`` with ``u_i`` the ``(D, T)``
    unfolded input patches of its views (``T = k L``): the Gram trick costs
    ``T^2 (D + P)`` per record and group, the direct gradient ``T D P``; the Gram trick is used
    only when it costs under half the direct one (it also pays for copying the patches).
    ``weight_scale`` ``(C_out,)`` multiplies the weight gradient's output channels (norms and
    sums; the bias keeps ``b``).
    """
    want_w, want_b = _wants(m)
    rows, g, c_out = a.shape[0], m.groups, m.out_channels
    bsz = rows // views
    b3 = _record_major(b.reshape(rows, c_out, -1), bsz, views, 1)  # (B, C_out, T)
    t = b3.shape[-1]
    dg, pg = (m.in_channels // g) * m.kernel_size[0] * m.kernel_size[1], c_out // g
    bw = b3 if weight_scale is None else b3 * weight_scale.view(1, -1, 1)
    b4 = bw.reshape(bsz, g, pg, t)
    sq = torch.zeros(bsz, dtype=a.dtype, device=a.device)
    per_sample: torch.Tensor | None = None
    patches: torch.Tensor | None = None
    if want_w:
        if 2 * t * t * (dg + pg) < t * dg * pg:  # Gram trick
            a_pad, pad = padded_input(m, a)
            u = F.unfold(a_pad, m.kernel_size, dilation=m.dilation, padding=pad, stride=m.stride)
            if u.shape[-1] * views != t:
                raise RuntimeError("conv patch count does not match the output size")
            patches = _record_major(u.reshape(rows, g, dg, -1), bsz, views, 2)
            gram_a = torch.matmul(patches.transpose(2, 3), patches)
            gram_b = torch.matmul(b4.transpose(2, 3), b4)
            sq = sq + (gram_a * gram_b).sum((1, 2, 3)).clamp_min(0.0)
        else:
            per_sample = _conv2d_per_sample(m, a, b4, views, (b.shape[2], b.shape[3]))
            sq = sq + torch.linalg.vector_norm(per_sample, dim=(1, 2, 3, 4)).square()
    bsum = b3.sum(2) if want_b else None
    if bsum is not None:
        sq = sq + (bsum * bsum).sum(1)

    def finish(c: torch.Tensor) -> list[torch.Tensor | None]:
        w = None
        if per_sample is not None:
            w = torch.einsum("b,bocij->ocij", c, per_sample)
        elif patches is not None:
            cb = b4 * c.view(-1, 1, 1, 1)
            w = torch.einsum("bgpl,bgdl->gpd", cb, patches).reshape(m.weight.shape)
        return [w, c.unsqueeze(0).mm(bsum).squeeze(0) if bsum is not None else None]

    return sq, finish


def group_norm_rule(
    m: nn.GroupNorm, a: torch.Tensor, z: torch.Tensor, b: torch.Tensor, views: int
) -> Rule:
    """``a``: input ``(B k, C, ...)``; ``b``: output gradient of the same shape."""
    want_w, want_b = _wants(m)
    rows, ch = a.shape[0], m.num_channels
    bsz = rows // views
    b3 = b.reshape(rows, ch, -1)
    gw = gb = None
    sq = torch.zeros(bsz, dtype=a.dtype, device=a.device)
    if want_w:
        xhat = F.group_norm(a, m.num_groups, eps=m.eps).reshape(rows, ch, -1)
        gw = (b3 * xhat).sum(2).reshape(bsz, views, ch).sum(1)
        sq = sq + gw.square().sum(1)
    if want_b:
        gb = b3.sum(2).reshape(bsz, views, ch).sum(1)
        sq = sq + gb.square().sum(1)

    def finish(c: torch.Tensor) -> list[torch.Tensor | None]:
        return [None if s is None else c.unsqueeze(0).mm(s).squeeze(0) for s in (gw, gb)]

    return sq, finish


def ws_conv2d_rule(
    m: WSConv2d, a: torch.Tensor, z: torch.Tensor, b: torch.Tensor, views: int
) -> Rule:
    """A weight-standardized convolution: the conv rule for ``w_hat`` scaled by ``1/s``, minus
    the components the standardization removes (module docstring)."""
    w = m.weight.detach()
    flat = w.reshape(w.shape[0], -1)
    n = flat.shape[1]
    var, mean = torch.var_mean(flat, dim=1, unbiased=False)
    s = (var + m.eps).sqrt()
    w_hat = (flat - mean[:, None]) / s[:, None]
    sq, finish = conv2d_rule(m, a, z, b, views, weight_scale=s.reciprocal())
    if not m.weight.requires_grad:
        return sq, finish
    rows, bsz, g = a.shape[0], a.shape[0] // views, m.groups
    a_pad, pad = padded_input(m, a)
    ones = torch.ones(g, m.in_channels // g, *m.kernel_size, dtype=a.dtype, device=a.device)
    psum = F.conv2d(a_pad, ones, None, m.stride, pad, m.dilation, g)  # (B k, g, H_out, W_out)
    b4 = b.reshape(rows, g, m.out_channels // g, -1)
    t1 = (b4 * psum.reshape(rows, g, 1, -1)).sum(3).reshape(bsz, views, -1).sum(1)
    out = z.detach() if m.bias is None else z.detach() - m.bias.detach().view(1, -1, 1, 1)
    t2 = (b * out).sum((2, 3)).reshape(bsz, views, -1).sum(1)
    rho = var / (var + m.eps)
    corr = (t1.square() + (2.0 - rho) * t2.square()) / (n * s.square())
    sq = (sq - corr.sum(1)).clamp_min(0.0)

    def finish_ws(c: torch.Tensor) -> list[torch.Tensor | None]:
        wsum, bsum = finish(c)
        if wsum is not None:
            f = wsum.reshape(flat.shape)
            f = f - f.mean(1, keepdim=True) - w_hat * ((w_hat * f).sum(1, keepdim=True) / n)
            wsum = f.reshape(w.shape)
        return [wsum, bsum]

    return sq, finish_ws


RULES: dict[type[nn.Module], Callable[..., Rule]] = {
    nn.Linear: linear_rule,
    nn.Conv2d: conv2d_rule,
    WSConv2d: ws_conv2d_rule,
    nn.GroupNorm: group_norm_rule,
}
"""The fast rule of each supported parameterized layer type (exact types)."""
