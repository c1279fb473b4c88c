"""The privacy event of one (optionally Poisson-subsampled) discrete Gaussian release.

The discrete Gaussian ``N_ℤ(0, s²)`` per coordinate, ℓ2 sensitivity ``Δ`` in lattice units, is
``Δ²/(2s²)``-zCDP: RDP ``ε(α) = α / (2 z²)`` with ``z = s/Δ`` (Canonne, Kamath, Steinke 2020,
"The Discrete Gaussian for Differential Privacy", arXiv:2004.00010, Theorems 4 and 15), the
continuous Gaussian's RDP curve; Poisson subsampling at rate ``q`` by the general RDP bound for
any mechanism (Steinke 2022, arXiv:2210.00597; :func:`fedpriv.accounting.samplers.poisson.
poisson_subsampled_rdp`), integer orders. The PLD of the discrete Gaussian is not the
continuous one's, so this event composes by RDP only (``privacy.accountant=rdp``).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from fedpriv.accounting.core.event import IntegerRdpEvent
from fedpriv.accounting.samplers.poisson import poisson_subsampled_rdp
from fedpriv.common.errors import check


@dataclasses.dataclass(frozen=True)
class DiscreteGaussianEvent(IntegerRdpEvent):
    """One discrete Gaussian release of noise multiplier ``noise_multiplier`` (noise std per
    unit of lattice sensitivity, rounding included: :func:`fedpriv.mechanisms.lattice_gaussian.
    lattice_noise_multiplier`), on a Poisson subsample of rate ``sample_rate`` (1: none).

    Bound: RDP ``α/(2z²)`` (Canonne, Kamath, Steinke, arXiv:2004.00010, Theorem 4 (scalar) and
    Theorem 15 (independent coordinates)), Poisson-subsampled by
    :func:`~fedpriv.accounting.samplers.poisson.poisson_subsampled_rdp` (Steinke,
    arXiv:2210.00597). Hypotheses: the add/remove relation (the default
    ``supported_relations``); the query is integer-valued on the lattice with ℓ2 sensitivity
    Δ (after rounding, which ``lattice_noise_multiplier`` charges); Theorem 4's bound is
    symmetric in the two means, so it bounds both orders of the divergence, which the
    subsampling theorem requires.

    Raises
    ------
    ConfigError
        For ``noise_multiplier <= 0`` or a rate outside [0, 1].
    """

    noise_multiplier: float
    sample_rate: float = 1.0

    def __post_init__(self) -> None:
        z = self.noise_multiplier
        check(math.isfinite(z) and z > 0, "noise_multiplier", z, "must be a finite number > 0")
        check(0 <= self.sample_rate <= 1, "sample_rate", self.sample_rate, "must be in [0, 1]")

    def rdp(self, orders: np.ndarray) -> np.ndarray:
        """RDP at integer ``orders`` (shape (k,)): α/(2z²), Poisson-subsampled."""

        def base(a: np.ndarray) -> np.ndarray:
            return np.asarray(a, dtype=float) / (2 * self.noise_multiplier**2)

        return poisson_subsampled_rdp(orders, self.sample_rate, base)
