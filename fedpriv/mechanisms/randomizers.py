"""Local randomizers of the random check-in protocols and the event of their releases.

A local randomizer ``A_ldp`` clips a client's update and adds noise calibrated to its own
(``local_epsilon``, ``local_delta``) budget, so every report a client sends is locally
differentially private on its own (the privacy unit is the client: replace-one sensitivity
``2 clipping_norm``). Clients apply it to their gradient; the server applies it to no data
(the zero vector) to make a dummy update. Core module: ``clients/`` and ``strategies/`` both
import it.

References
----------
Balle, Bell, Gascon, Kairouz, Thakurta, "Privacy Amplification via Random Check-Ins"
(arXiv:2007.06605), Section 3 (the local randomizer ``A_ldp`` and dummy updates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

import torch
from dp_accounting import dp_event

from fedpriv.accounting.gdp import analytic_gaussian_sigma, gdp_delta, gdp_epsilon
from fedpriv.accounting.ledger import FedprivEvent
from fedpriv.common.validate import check_finite, check_positive, parse_enum
from fedpriv.common.errors import check
from fedpriv.mechanisms.clipping import clip_tensors

__all__ = ["RandomizerKind", "LocalRandomizer", "LocalReleaseEvent"]


class RandomizerKind(StrEnum):
    """The local randomizer: analytic Gaussian ((eps0, delta0)-DP, l2 clip) or Laplace (pure
    eps0-DP, l1 clip). A closed set: any other noise would not carry the accounted guarantee."""

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
    """The local randomizer ``A_ldp``: clip to ``clipping_norm`` and add calibrated noise.

    Parameters
    ----------
    kind : RandomizerKind or {"gaussian", "laplace"}
        ``gaussian``: l2 clip, Gaussian noise calibrated by the analytic Gaussian mechanism to
        (``local_epsilon``, ``local_delta``) at l2 sensitivity ``2 clipping_norm``;
        ``laplace``: l1 clip, Laplace noise of scale ``2 clipping_norm / local_epsilon``
        (pure ``local_epsilon``-DP; needs ``local_delta = 0``).
    clipping_norm : float
        ``L > 0`` (norm of the clipped update; l2 or l1 by ``kind``).
    local_epsilon : float
        ``eps0 > 0``.
    local_delta : float
        ``delta0``: in (0, 1) for ``gaussian``, 0 for ``laplace``.

    Raises
    ------
    ConfigError
        On out-of-range values (field names as in the ``privacy`` group).

    References
    ----------
    Balle, Wang, "Improving the Gaussian Mechanism for Differential Privacy: Analytical
    Calibration and Optimal Denoising" (arXiv:1805.06530), Theorem 8 (analytic Gaussian);
    Dwork, McSherry, Nissim, Smith (2006) (Laplace). Used as ``A_ldp`` in "Privacy
    Amplification via Random Check-Ins" (Balle et al., arXiv:2007.06605), Section 3.
    """

    kind: RandomizerKind
    clipping_norm: float
    local_epsilon: float
    local_delta: float = 0.0

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "kind", parse_enum(RandomizerKind, "client.randomizer", self.kind))
        for name in ("clipping_norm", "local_epsilon", "local_delta"):
            set_(self, name, check_finite(f"privacy.{name}", getattr(self, name)))
        check(self.clipping_norm > 0, "privacy.clipping_norm", self.clipping_norm, "must be > 0")
        check(self.local_epsilon > 0, "privacy.local_epsilon", self.local_epsilon, "must be > 0")
        if self.kind is RandomizerKind.GAUSSIAN:
            check(
                0.0 < self.local_delta < 1.0,
                "privacy.local_delta",
                self.local_delta,
                "must be in (0, 1) for the gaussian randomizer "
                "(use client.randomizer=laplace for pure eps0-DP)",
            )
        else:
            check(
                self.local_delta == 0.0,
                "privacy.local_delta",
                self.local_delta,
                "must be 0 for the laplace randomizer (pure eps0-DP)",
            )

    @property
    def sensitivity(self) -> float:
        """Replace-one sensitivity of the clipped update: ``2L`` (l2 or l1 by ``kind``)."""
        return 2.0 * self.clipping_norm

    @property
    def noise_stddev(self) -> float:
        """Per-coordinate noise std: ``sigma`` (gaussian) or ``sqrt(2) b`` (laplace)."""
        if self.kind is RandomizerKind.GAUSSIAN:
            return analytic_gaussian_sigma(self.local_epsilon, self.local_delta, self.sensitivity)
        return math.sqrt(2.0) * self.laplace_scale

    @property
    def laplace_scale(self) -> float:
        """Laplace scale ``b = 2L / eps0`` (laplace only)."""
        return self.sensitivity / self.local_epsilon

    def clip(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Clip the concatenation of ``tensors`` to l2 (gaussian) or l1 (laplace) norm ``L``."""
        keys = list(tensors)
        if self.kind is RandomizerKind.GAUSSIAN:
            return dict(
                zip(keys, clip_tensors([tensors[k] for k in keys], self.clipping_norm), strict=True)
            )
        norm = sum(float(t.double().abs().sum()) for t in tensors.values())
        factor = min(1.0, self.clipping_norm / norm) if norm > 0 else 1.0
        return {k: t * factor for k, t in tensors.items()}

    def noise(
        self,
        shapes: dict[str, tuple[int, ...]],
        generator: torch.Generator,
        dtype: torch.dtype = torch.float32,
    ) -> dict[str, torch.Tensor]:
        """The randomizer applied to no data (a dummy update): noise of the given shapes."""
        out: dict[str, torch.Tensor] = {}
        for k, shape in shapes.items():
            size = torch.Size(shape)
            if self.kind is RandomizerKind.GAUSSIAN:
                out[k] = (
                    self.noise_stddev
                    * torch.randn(
                        size, generator=generator, dtype=torch.float64, device=generator.device
                    )
                ).to(dtype)
            else:
                out[k] = _laplace(size, self.laplace_scale, generator, dtype)
        return out

    def randomize(
        self, tensors: dict[str, torch.Tensor], generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """``A_ldp``: clip, then add the noise (shapes and dtypes kept)."""
        clipped = self.clip(tensors)
        noise = self.noise({k: tuple(t.shape) for k, t in clipped.items()}, generator)
        return {k: clipped[k] + noise[k].to(clipped[k].dtype) for k in clipped}

    def local_event(self) -> LocalReleaseEvent:
        """One release of this randomizer: noise in units of its sensitivity ``2L``."""
        scale = self.noise_stddev if self.kind is RandomizerKind.GAUSSIAN else self.laplace_scale
        return LocalReleaseEvent(self.kind.value, scale / self.sensitivity)


@dataclass(frozen=True)
class LocalReleaseEvent(FedprivEvent):
    """A client's own releases of its local randomizer (its local DP), in sensitivity units.

    ``noise_multiplier`` is the Gaussian std (or Laplace scale) divided by the replace-one
    sensitivity ``2L``. ``count`` Gaussian releases are exactly ``G_mu`` with
    ``mu = sqrt(count) / noise_multiplier`` (Gaussian differential privacy); ``count`` Laplace
    releases compose through dp-accounting's PLD of the sensitivity-1 Laplace mechanism (the
    two neighbouring outputs differ by at most one sensitivity unit, dp-accounting's
    add/remove case), or by basic composition ``count / noise_multiplier`` (= ``count eps0``)
    when ``eps0 > 20``, where the PLD grid would not fit in memory and basic composition is
    within a rounding of it.

    Raises
    ------
    ConfigError
        For an unknown ``kind`` or a ``noise_multiplier`` that is not finite and > 0.

    References
    ----------
    Dong, Roth, Su, "Gaussian Differential Privacy" (arXiv:1905.02383), Corollary 2
    (composition of Gaussian mechanisms).
    """

    kind: str
    noise_multiplier: float

    supported_relations: ClassVar[frozenset[str]] = frozenset({"replace_one", "add_remove"})

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "kind", parse_enum(RandomizerKind, "kind", self.kind).value)
        nm = check_positive("noise_multiplier", self.noise_multiplier, "must be finite and > 0")
        set_(self, "noise_multiplier", nm)

    def _pld(self, count: int) -> Any:
        from dp_accounting.pld import pld_privacy_accountant

        acc = pld_privacy_accountant.PLDAccountant()
        acc.compose(dp_event.LaplaceDpEvent(self.noise_multiplier), int(count))
        return acc

    def _basic(self) -> bool:
        return self.kind == RandomizerKind.LAPLACE and 1.0 / self.noise_multiplier > 20.0

    def epsilon(self, target_delta: float, count: int = 1) -> float:
        if count == 0:
            return 0.0
        if self.kind == RandomizerKind.GAUSSIAN:
            return gdp_epsilon(target_delta, math.sqrt(count) / self.noise_multiplier)
        if self._basic():
            return count / self.noise_multiplier
        return float(self._pld(count).get_epsilon(target_delta))

    def delta(self, target_epsilon: float, count: int = 1) -> float:
        if count == 0:
            return 0.0
        if self.kind == RandomizerKind.GAUSSIAN:
            return float(gdp_delta(target_epsilon, math.sqrt(count) / self.noise_multiplier))
        if self._basic():
            return 0.0 if target_epsilon >= count / self.noise_multiplier else 1.0
        return float(self._pld(count).get_delta(target_epsilon))
