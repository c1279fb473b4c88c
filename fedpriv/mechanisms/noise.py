"""Gaussian noise for real-valued updates, sampled from an explicit generator.

``secure_mode`` seeds the generator from the OS's cryptographic entropy instead of a seed
(:class:`fedpriv.accounting.spec.NoiseSource` ``secure``); research runs pass a seed for
reproducibility (``seeded``: anyone holding the config can regenerate the noise and subtract
it, so never for a deployment). Floating-point Gaussian sampling is not hardened against the
Mironov 2012 attacks (results.json: ``float_noise_hardened: false``); use the Skellam
mechanism where that matters. The runner states both in the header and results.json.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

import numpy as np
import torch

from fedpriv.common.errors import check


def make_generator(
    seed: int | None, device: torch.device | str = "cpu", secure_mode: bool = False
) -> torch.Generator:
    """A torch Generator on ``device`` seeded by ``seed``, or from OS entropy if ``secure_mode``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(secrets.randbits(63) if secure_mode or seed is None else int(seed))
    return gen


def add_gaussian_noise(
    tensors: Mapping[str, torch.Tensor], noise_stddev: float, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """Return ``tensors`` plus i.i.d. N(0, noise_stddev²) noise per coordinate (shapes kept).

    Raises
    ------
    ConfigError
        If ``noise_stddev < 0``.
    """
    check(noise_stddev >= 0, "noise_stddev", noise_stddev, "must be >= 0")
    if noise_stddev == 0:
        return dict(tensors)
    return {  # one allocation per tensor: the noise buffer becomes the result
        k: torch.randn(t.shape, generator=generator, device=t.device, dtype=t.dtype)
        .mul_(noise_stddev)
        .add_(t)
        for k, t in tensors.items()
    }


def gaussian_noise_arrays(
    shapes: Mapping[str, tuple[int, ...]], noise_stddev: float, generator: torch.Generator
) -> dict[str, np.ndarray]:
    """i.i.d. N(0, noise_stddev²) per entry of each shape, drawn in float64 from ``generator``
    (on its device), as CPU numpy arrays (e.g. a trusted aggregator's noise on a sum).

    Raises
    ------
    ConfigError
        If ``noise_stddev < 0``.
    """
    check(noise_stddev >= 0, "noise_stddev", noise_stddev, "must be >= 0")
    out: dict[str, np.ndarray] = {}
    for k, shape in shapes.items():
        z = torch.randn(
            torch.Size(shape), generator=generator, dtype=torch.float64, device=generator.device
        )
        out[k] = (noise_stddev * z).cpu().numpy()
    return out


#: Spawn key of the trusted aggregator's noise stream (never a client's ``(seed, round, id)``).
_SERVER_NOISE_STREAM = 0x5E4F


def server_generator(seed: int, server_round: int, secure_mode: bool = False) -> torch.Generator:
    """The trusted aggregator's noise generator for ``server_round``: seeded from
    ``(seed, server_round)`` with its own spawn key, or from OS entropy if ``secure_mode``."""
    seq = np.random.SeedSequence([int(seed), int(server_round)], spawn_key=(_SERVER_NOISE_STREAM,))
    return make_generator(int(seq.generate_state(1, np.uint64)[0] >> 1), secure_mode=secure_mode)
