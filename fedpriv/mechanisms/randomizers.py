"""Local randomizers of the random check-in protocols: clip a client's update, add noise.

A local randomizer ``A_ldp`` clips a client's update to ``clipping_norm`` ``L`` (l2 for the
Gaussian, l1 for the Laplace randomizer) and adds i.i.d. noise of a GIVEN scale. Clients apply
it to their gradient; the server applies it to no data (the zero vector) to make a dummy
update. This module only draws: the scale that makes each report (``local_epsilon``,
``local_delta``)-DP, and the event of a client's releases, are the accounting's
(:mod:`fedpriv.accounting.loss_models.local_randomizer`, which builds the randomizer a run uses).

References
----------
Balle, Bell, Gascon, Kairouz, Thakurta, "Privacy Amplification via Random Check-Ins"
(arXiv:2007.06605), Section 3 (the local randomizer ``A_ldp`` and dummy updates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

import torch

from fedpriv.common.errors import check
from fedpriv.common.validate import check_finite, parse_enum
from fedpriv.mechanisms.clipping import clip_tensors

__all__ = ["RandomizerKind", "LocalRandomizer"]


class RandomizerKind(StrEnum):
    """The local randomizer: Gaussian noise on an l2 clip, or Laplace noise on an l1 clip. A
    closed set: any other noise would not carry the accounted guarantee."""

    GAUSSIAN = "gaussian"
    LAPLACE = "laplace"


def _laplace(
    shape: torch.Size, scale: float, generator: torch.Generator, dtype: torch.dtype
) -> torch.Tensor:
    """i.i.d. Laplace(0, scale) as the difference of two Exp(1) draws (no log(0) possible)."""
    e1 = torch.empty(shape, dtype=torch.float64, device=generator.device).exponential_(
        generator=generator
    )
    e2 = torch.empty(shape, dtype=torch.float64, device=generator.device).exponential_(
        generator=generator
    )
    return (scale * (e1 - e2)).to(dtype)


@dataclass(frozen=True)
class LocalRandomizer:
    """The local randomizer ``A_ldp``: clip to ``clipping_norm`` and add noise of ``noise_scale``.

    Parameters
    ----------
    kind : RandomizerKind or {"gaussian", "laplace"}
        ``gaussian``: l2 clip, N(0, ``noise_scale``²) per coordinate; ``laplace``: l1 clip,
        Laplace(0, ``noise_scale``) per coordinate.
    clipping_norm : float
        ``L > 0``: the norm (l2 or l1 by ``kind``) every clipped update is brought within.
    noise_scale : float
        ``> 0``, in the units of the update: the Gaussian's std ``sigma`` or the Laplace
        scale ``b`` (std ``sqrt(2) b``).

    Raises
    ------
    ConfigError
        On out-of-range values (``client.randomizer``, ``privacy.clipping_norm``,
        ``noise_scale``).

    References
    ----------
    Used as ``A_ldp`` in "Privacy Amplification via Random Check-Ins" (Balle et al.,
    arXiv:2007.06605), Section 3.
    """

    kind: RandomizerKind
    clipping_norm: float
    noise_scale: float

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "kind", parse_enum(RandomizerKind, "client.randomizer", self.kind))
        set_(self, "clipping_norm", check_finite("privacy.clipping_norm", self.clipping_norm))
        set_(self, "noise_scale", check_finite("noise_scale", self.noise_scale))
        check(self.clipping_norm > 0, "privacy.clipping_norm", self.clipping_norm, "must be > 0")
        check(self.noise_scale > 0, "noise_scale", self.noise_scale, "must be > 0")

    @property
    def sensitivity(self) -> float:
        """Replace-one sensitivity of the clipped update: ``2L`` (l2 or l1 by ``kind``)."""
        return 2.0 * self.clipping_norm

    @property
    def noise_stddev(self) -> float:
        """Per-coordinate noise std: ``sigma`` (gaussian) or ``sqrt(2) b`` (laplace)."""
        if self.kind is RandomizerKind.GAUSSIAN:
            return self.noise_scale
        return math.sqrt(2.0) * self.laplace_scale

    @property
    def laplace_scale(self) -> float:
        """Laplace scale ``b`` (laplace only).

        Raises
        ------
        ConfigError
            For the Gaussian randomizer.
        """
        check(
            self.kind is RandomizerKind.LAPLACE,
            "client.randomizer",
            self.kind.value,
            "has no Laplace scale (laplace only)",
        )
        return self.noise_scale

    def clip(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Clip the concatenation of ``tensors`` to l2 (gaussian) or l1 (laplace) norm ``L``."""
        keys = list(tensors)
        if self.kind is RandomizerKind.GAUSSIAN:
            clipped = clip_tensors([tensors[k] for k in keys], self.clipping_norm)
            return dict(zip(keys, clipped, strict=True))
        norm = sum(float(t.double().abs().sum()) for t in tensors.values())
        factor = min(1.0, self.clipping_norm / norm) if norm > 0 else 1.0
        return {k: t * factor for k, t in tensors.items()}

    def noise(
        self,
        shapes: dict[str, tuple[int, ...]],
        generator: torch.Generator,
        dtype: torch.dtype = torch.float32,
    ) -> dict[str, torch.Tensor]:
        """The randomizer applied to no data (a dummy update): noise of the given shapes,
        drawn in float64 from ``generator`` and cast to ``dtype``."""
        out: dict[str, torch.Tensor] = {}
        for k, shape in shapes.items():
            size = torch.Size(shape)
            if self.kind is RandomizerKind.GAUSSIAN:
                z = torch.randn(
                    size, generator=generator, dtype=torch.float64, device=generator.device
                )
                out[k] = (self.noise_scale * z).to(dtype)
            else:
                out[k] = _laplace(size, self.noise_scale, generator, dtype)
        return out

    def randomize(
        self, tensors: dict[str, torch.Tensor], generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """``A_ldp``: clip, then add the noise (shapes and dtypes kept)."""
        clipped = self.clip(tensors)
        noise = self.noise({k: tuple(t.shape) for k, t in clipped.items()}, generator)
        return {k: clipped[k] + noise[k].to(clipped[k].dtype) for k in clipped}
