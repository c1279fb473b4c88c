"""Augmentation multiplicity: K augmented views of each record of a batch.

De et al., "Unlocking High-Accuracy Differentially Private Image Classification through
Scale" (arXiv:2204.13650, Section 3.1): each record's gradient is the MEAN of its gradients on
K augmented views, computed before the per-record clip, so one record still moves the clipped
sum by at most C and the accounting is that of one gradient per record. The views here are
the standard CIFAR-10 augmentation: a random crop of the image padded by ``pad`` pixels (zero
padding after standardization), then a horizontal flip with probability 1/2.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fedpriv.common.errors import ConfigError

#: Crop offsets ``(B k, 2)`` and flips ``(B k,)`` of a batch's views (:func:`view_draws`).
Draws = tuple[np.ndarray, np.ndarray]


def check_augmult(k: object) -> None:
    """Refuse a ``client.augmult`` that is not an integer >= 0 (one line naming the field)."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise ConfigError(
            "client.augmult", k, "must be an integer >= 0 (augmented views per record; 0: none)"
        )


def check_images(k: int, input_shape: tuple[int, ...]) -> None:
    """Refuse augmentation multiplicity (``k`` > 0) on data that are not images.

    Raises
    ------
    ConfigError
        ``client.augmult=2 needs image inputs (C, H, W); this dataset's records have shape
        (105,)``.
    """
    if k > 0 and len(input_shape) != 3:
        raise ConfigError(
            "client.augmult",
            k,
            f"needs image inputs (C, H, W); this dataset's records have shape {input_shape}",
        )


def views_key(rng: np.random.Generator) -> np.ndarray:
    """A key for a round's views, spawned from the seed sequence of ``rng`` without drawing
    from it (the client's sampling and noise streams are untouched)."""
    return rng.bit_generator.seed_seq.spawn(1)[0].generate_state(2)  # type: ignore[attr-defined]


def view_draws(
    key: np.ndarray, step: int, records: np.ndarray, k: int, pad: int = 4
) -> tuple[np.ndarray, np.ndarray]:
    """Crop offsets ``(B k, 2)`` in ``[0, 2 pad]`` and flips ``(B k,)`` for ``k`` views of
    each of ``records`` (their indices in the client's data) at local ``step``. Record ``i``'s
    draws come from the stream ``(key, step, i)`` alone, so its views do not depend on which
    other records the batch holds."""
    offsets = np.empty((len(records) * k, 2), dtype=np.int64)
    flips = np.empty(len(records) * k, dtype=bool)
    for j, i in enumerate(records):
        gen = np.random.default_rng([*key.tolist(), step, int(i)])
        offsets[j * k : (j + 1) * k] = gen.integers(0, 2 * pad + 1, (k, 2))
        flips[j * k : (j + 1) * k] = gen.random(k) < 0.5
    return offsets, flips


def augment_views(
    x: torch.Tensor, offsets: np.ndarray, flips: np.ndarray, pad: int = 4
) -> torch.Tensor:
    """Random crop-and-flip views of every image (:func:`view_draws` gives the draws).

    Parameters
    ----------
    x : torch.Tensor
        Images ``(B, C, H, W)``.
    offsets, flips : np.ndarray
        ``(B k, 2)`` crop offsets into the padded image and ``(B k,)`` flips: rows
        ``b k .. b k + k - 1`` are image ``b``'s views.
    pad : int
        Zero padding before the crop, pixels, >= 0.

    Returns
    -------
    torch.Tensor
        ``(B, k, C, H, W)``: ``out[b, j]`` is view ``j`` of image ``b``.

    Raises
    ------
    ConfigError
        If ``x`` is not a batch of images (named ``client.augmult``).
    """
    if x.dim() != 4:
        raise ConfigError(
            "client.augmult",
            len(flips) // max(len(x), 1),
            f"needs image inputs (B, C, H, W); the data has {tuple(x.shape)}",
        )
    b, c, h, w = x.shape
    n = len(flips)
    dev = x.device
    off = torch.from_numpy(offsets).to(dev)
    padded = F.pad(x, (pad, pad, pad, pad)).repeat_interleave(n // b, dim=0)
    rows = off[:, 0:1] + torch.arange(h, device=dev)[None, :]
    cols = off[:, 1:2] + torch.arange(w, device=dev)[None, :]
    cols = torch.where(torch.from_numpy(flips).to(dev)[:, None], cols.flip(1), cols)
    idx_n = torch.arange(n, device=dev)[:, None, None, None]
    idx_c = torch.arange(c, device=dev)[None, :, None, None]
    views = padded[idx_n, idx_c, rows[:, None, :, None], cols[:, None, None, :]]
    return views.reshape(b, n // b, c, h, w)
