"""Norm clipping of updates and gradients, safe for 0-d tensors and all-zero inputs.

``[x]_C = x / max(1, ||x||_2 / C)``. A zero vector is returned unchanged (no division by
zero), and a 0-d tensor is clipped like a 1-element vector (Flower's helpers leave it
unclipped).

References
----------
Abadi et al. (2016), "Deep Learning with Differential Privacy", arXiv:1607.00133, Algorithm 1.
van Dijk et al., "Generalizing DP-SGD with Shuffling and Batch Clipping", arXiv:2212.05796,
Algorithm 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedpriv.common.errors import check


def global_norm(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """L2 norm of the concatenation of ``tensors`` (any shapes, 0-d included); a 0-d tensor."""
    if len(tensors) == 0:
        return torch.zeros(())
    norm: torch.Tensor = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(t.reshape(-1).double()) for t in tensors])
    ).to(tensors[0].dtype)
    return norm


def clip_factor(norm: torch.Tensor, clipping_norm: float) -> torch.Tensor:
    """``min(1, C / norm)`` elementwise, equal to 1 where ``norm == 0`` (shape of ``norm``)."""
    return torch.clamp(clipping_norm / torch.clamp(norm, min=1e-30), max=1.0)


def clip_tensors(tensors: Sequence[torch.Tensor], clipping_norm: float) -> list[torch.Tensor]:
    """Clip the concatenation of ``tensors`` to L2 norm ``clipping_norm`` (shapes kept).

    Raises
    ------
    ConfigError
        If ``clipping_norm`` is not > 0.
    """
    check(clipping_norm > 0, "clipping_norm", clipping_norm, "must be > 0")
    factor = clip_factor(global_norm(tensors), clipping_norm)
    return [t * factor.to(t.dtype) for t in tensors]
