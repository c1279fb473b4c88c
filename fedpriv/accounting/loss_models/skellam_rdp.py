"""The Skellam mechanism's privacy loss: its RDP curve, its sensitivities after rounding, and
the event of one (optionally Poisson-subsampled) release.

The (distributed) Skellam mechanism (Agarwal, Kairouz, Liu 2021) scales a vector by ``scale``,
rounds it randomly to integers, adds ``Sk(μ) = Pois(μ) - Pois(μ)`` per coordinate (variance
2μ), sums modulo ``2**bits`` and unscales. Everything here is in the scaled integer domain:
``mu`` is the Poisson mean of each side of the *total* noise and the sensitivities are those
of one rounded, scaled contribution. Neighbouring relation: add/remove (one contribution
present or absent); the noise is symmetric, so the RDP curve bounds both orders of the
divergence, the hypothesis of Poisson subsampling
(:func:`fedpriv.accounting.samplers.poisson.poisson_subsampled_rdp`).

References
----------
Agarwal, Kairouz, Liu (2021), "The Skellam Mechanism for Differentially Private Federated
Learning", NeurIPS, arXiv:2110.04995, Theorem 3.5 / Corollary 3.6 (RDP).
Kairouz, Liu, Steinke (2021), "The Distributed Discrete Gaussian Mechanism for Federated
Learning with Secure Aggregation", ICML, arXiv:2102.06387, Theorem 1 (norm after conditional
randomized rounding).
Steinke (2022), arXiv:2210.00597 (RDP of Poisson subsampling, integer orders, add/remove).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from fedpriv.accounting.core.event import IntegerRdpEvent
from fedpriv.accounting.samplers.poisson import integer_orders, poisson_subsampled_rdp
from fedpriv.common.errors import check
from fedpriv.mechanisms.skellam_noise import rounded_norm_bound

__all__ = ["SkellamEvent", "rounded_sensitivities", "skellam_rdp"]


def skellam_rdp(
    orders: np.ndarray, mu: float, l1_sensitivity: float, l2_sensitivity: float
) -> np.ndarray:
    """RDP ε(α) of the Skellam mechanism ``x + Sk(μ)`` per coordinate (no subsampling).

    ``ε(α) = αΔ2²/(4μ) + min(((2α−1)Δ2² + 6Δ1)/(16μ²), 3Δ1/(4μ))`` (Agarwal, Kairouz, Liu,
    arXiv:2110.04995, Theorem 3.5 / Corollary 3.6, with the noise variance 2μ; the Gaussian
    of the same variance has the first term only).

    Hypotheses: the two neighbouring inputs, scaled and rounded, differ by an integer vector
    of ℓ1 norm <= Δ1 and ℓ2 norm <= Δ2: under add/remove one contribution's own norms
    (:func:`rounded_sensitivities`), under replace-one the difference of two contributions
    (up to twice those); the noise is exactly ``Sk(μ)`` per coordinate. ``Sk(μ)`` is
    symmetric, so the curve bounds ``D_α`` in both orders, which Poisson subsampling
    (:func:`~fedpriv.accounting.samplers.poisson.poisson_subsampled_rdp`) requires.

    Parameters
    ----------
    orders : array of int, shape (k,)
        Integer orders α >= 2.
    mu : float
        Poisson mean of each side, > 0 (noise variance 2μ per coordinate), scaled units.
    l1_sensitivity, l2_sensitivity : float
        Δ1, Δ2 >= 0 of one contribution in scaled integer units.

    Returns
    -------
    np.ndarray, shape (k,)
        ε(α); ``inf`` where μ = 0 and Δ2 > 0.

    Raises
    ------
    ConfigError
        For non-integer orders or negative parameters.
    """
    a = integer_orders(orders)
    check(mu >= 0 and math.isfinite(mu), "mu", mu, "must be a finite number >= 0")
    check(l1_sensitivity >= 0, "l1_sensitivity", l1_sensitivity, "must be >= 0")
    check(l2_sensitivity >= 0, "l2_sensitivity", l2_sensitivity, "must be >= 0")
    d1, d2 = float(l1_sensitivity), float(l2_sensitivity)
    if d2 == 0 and d1 == 0:
        return np.zeros_like(a)
    if mu == 0:
        return np.full_like(a, np.inf)
    extra = np.minimum(((2 * a - 1) * d2**2 + 6 * d1) / (16 * mu**2), 3 * d1 / (4 * mu))
    return a * d2**2 / (4 * mu) + extra


def rounded_sensitivities(
    clipping_norm: float, scale: float, num_params: int, beta: float = 0.0
) -> tuple[float, float]:
    """ℓ1 and ℓ2 sensitivity of one clipped vector after scaling and randomized rounding.

    A vector of ℓ2 norm ≤ ``clipping_norm`` is multiplied by ``scale`` and each of its
    ``num_params`` coordinates is rounded up or down at random. Rounding moves each coordinate
    by < 1, so ``Δ2 = sC + √d`` always; with *conditional* rounding (re-round until the norm
    is below the bound; failure probability ``beta``) also
    ``Δ2 ≤ √((sC)² + d/4 + √(2 ln(1/β)) (sC + √d/2))`` (Kairouz, Liu, Steinke,
    arXiv:2102.06387, Theorem 1). For an integer vector ``‖x‖1 ≤ min(√d ‖x‖2, ‖x‖2²)``.

    Hypotheses: the add/remove relation (a contribution present or absent; under replace-one
    the difference of two rounded vectors is up to twice these); the clients round with this
    ``beta`` and redraw until the norm bound holds (conditional rounding), so the bound is
    sure, not a high-probability one.

    Parameters
    ----------
    clipping_norm : float
        C > 0 (unscaled).
    scale : float
        s > 0.
    num_params : int
        d >= 1, the dimension.
    beta : float
        Conditional rounding parameter in [0, 1); 0 means unconditional rounding. Use the
        value the clients actually use, else the bound does not hold.

    Returns
    -------
    (float, float)
        (Δ1, Δ2) in scaled integer units.

    Raises
    ------
    ConfigError
        For out-of-range arguments.
    """
    check(
        clipping_norm > 0 and math.isfinite(clipping_norm),
        "max_grad_norm",
        clipping_norm,
        "must be > 0",
    )
    check(scale > 0 and math.isfinite(scale), "scale", scale, "must be > 0")
    check(
        isinstance(num_params, (int, np.integer)) and num_params >= 1,
        "num_params",
        num_params,
        "must be an integer >= 1",
    )
    check(0 <= beta < 1, "beta", beta, "must be in [0, 1)")
    l2 = rounded_norm_bound(int(num_params), scale * clipping_norm, beta)
    l1 = l2 * min(math.sqrt(num_params), l2)
    return l1, l2


@dataclasses.dataclass(frozen=True)
class SkellamEvent(IntegerRdpEvent):
    """One (optionally Poisson-subsampled) Skellam release, in scaled integer units.

    Its RDP curve is :func:`skellam_rdp` (Agarwal, Kairouz, Liu, arXiv:2110.04995, Theorem
    3.5) amplified by :func:`~fedpriv.accounting.samplers.poisson.poisson_subsampled_rdp`
    (Steinke, arXiv:2210.00597), integer orders. Hypotheses: the add/remove relation (the
    default ``supported_relations``); the released sum carries exactly ``Sk(μ)`` (the
    clients' shares ``Sk(μ_i)`` sum to ``Sk(Σ μ_i)``); Δ1, Δ2 bound every contribution as the
    clients round it (:func:`rounded_sensitivities`); the symmetric noise makes the base
    curve bound both orders of the divergence, the subsampling theorem's hypothesis.

    Parameters
    ----------
    mu : float
        Poisson mean of each side of the total noise (variance 2μ per coordinate), > 0.
    l1_sensitivity, l2_sensitivity : float
        Δ1, Δ2 of one contribution (scaled, rounded), > 0.
    sample_rate : float
        Poisson sampling rate q in [0, 1] (1 = no subsampling).
    """

    mu: float
    l1_sensitivity: float
    l2_sensitivity: float
    sample_rate: float = 1.0

    def __post_init__(self) -> None:
        check(
            math.isfinite(self.mu) and self.mu >= 0, "mu", self.mu, "must be a finite number >= 0"
        )
        check(self.l1_sensitivity > 0, "l1_sensitivity", self.l1_sensitivity, "must be > 0")
        check(self.l2_sensitivity > 0, "l2_sensitivity", self.l2_sensitivity, "must be > 0")
        check(0 <= self.sample_rate <= 1, "sample_rate", self.sample_rate, "must be in [0, 1]")

    def rdp(self, orders: np.ndarray) -> np.ndarray:
        """RDP of one release at integer ``orders`` (AKL21 Thm 3.5, Steinke 2022)."""

        def base(a: np.ndarray) -> np.ndarray:
            return skellam_rdp(a, self.mu, self.l1_sensitivity, self.l2_sensitivity)

        return poisson_subsampled_rdp(orders, self.sample_rate, base)
