"""Skellam mechanism: RDP, Poisson subsampling of any RDP curve, rounding sensitivities.

The (distributed) Skellam mechanism (Agarwal, Kairouz, Liu 2021) scales a vector by ``scale``,
rounds it randomly to integers, adds ``Sk(μ) = Pois(μ) - Pois(μ)`` per coordinate (variance
2μ), sums modulo ``2**bits`` and unscales. Everything here is in the scaled integer domain:
``mu`` is the Poisson mean of each side of the *total* noise and the sensitivities are those
of one rounded, scaled contribution.

References
----------
Agarwal, Kairouz, Liu (2021), "The Skellam Mechanism for Differentially Private Federated
Learning", NeurIPS, Theorem 3.5 / Corollary 3.6 (RDP).
Steinke (2022), "Composition of Differential Privacy & Privacy Amplification by Subsampling",
arXiv 2210.00597 (RDP of Poisson subsampling, integer orders, add/remove).
Kairouz, Liu, Steinke (2021), "The Distributed Discrete Gaussian Mechanism for Federated
Learning with Secure Aggregation", ICML, Theorem 1 (norm after conditional randomized rounding).
PRIVACY-SPEC.md §0 and §3.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from scipy import special

from fedpriv.accounting.ledger import (
    CONVERSIONS,
    INTEGER_ORDERS,
    MIRONOV_ORDERS,
    FedprivEvent,
    rdp_to_delta,
    rdp_to_epsilon,
)
from fedpriv.accounting.params import Params
from fedpriv.errors import ConfigError, check


def _integer_orders(orders: np.ndarray) -> np.ndarray:
    orders = np.asarray(orders, dtype=float)
    if orders.size == 0 or np.any(orders < 2) or np.any(orders != np.round(orders)):
        raise ConfigError("orders", orders.tolist(), "must be integers >= 2 (Skellam/Steinke RDP)")
    return orders


def skellam_rdp(
    orders: np.ndarray, mu: float, l1_sensitivity: float, l2_sensitivity: float
) -> np.ndarray:
    """RDP ε(α) of the Skellam mechanism ``x + Sk(μ)`` per coordinate (no subsampling).

    ``ε(α) = αΔ2²/(4μ) + min(((2α−1)Δ2² + 6Δ1)/(16μ²), 3Δ1/(4μ))`` (AKL21 Thm 3.5 with
    the noise variance 2μ; the Gaussian of the same variance has the first term only).

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
    a = _integer_orders(orders)
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


def poisson_subsampled_rdp(
    orders: np.ndarray, sample_rate: float, base_rdp: Callable[[np.ndarray], np.ndarray]
) -> np.ndarray:
    """RDP of a mechanism run on a Poisson subsample (rate q), add/remove, integer α.

    ``ε'(α) = 1/(α−1) ln[(1−q)^{α−1}(1+(α−1)q) + Σ_{j=2..α} C(α,j)(1−q)^{α−j} q^j e^{(j−1)ε(j)}]``
    (Steinke 2022; for the Gaussian it equals the exact formula of Mironov, Talwar, Zhang 2019),
    and never more than the unsampled ``ε(α)``.

    Parameters
    ----------
    orders : array of int, shape (k,)
        Integer orders α >= 2.
    sample_rate : float
        q in [0, 1].
    base_rdp : callable
        Integer orders (array) -> RDP ε(j) of the unsampled mechanism (same shape).

    Returns
    -------
    np.ndarray, shape (k,)
    """
    a = _integer_orders(orders)
    check(0 <= sample_rate <= 1, "sample_rate", sample_rate, "must be in [0, 1]")
    base = np.asarray(base_rdp(a), dtype=float)
    if sample_rate == 1:
        return base
    if sample_rate == 0:
        return np.zeros_like(a)
    q = float(sample_rate)
    j = np.arange(2, int(a.max()) + 1, dtype=float)
    eps_j = np.asarray(base_rdp(j), dtype=float)
    A = a[:, None]
    J = j[None, :]
    with np.errstate(invalid="ignore", over="ignore"):
        log_terms = (
            special.gammaln(A + 1)
            - special.gammaln(J + 1)
            - special.gammaln(A - J + 1)
            + (A - J) * math.log1p(-q)
            + J * math.log(q)
            + (J - 1) * eps_j[None, :]
        )
    log_terms = np.where(J <= A, log_terms, -np.inf)
    log0 = (a - 1) * math.log1p(-q) + np.log1p((a - 1) * q)
    total = special.logsumexp(np.concatenate([log0[:, None], log_terms], axis=1), axis=1)
    return np.minimum(total / (a - 1), base)


def rounded_sensitivities(
    clipping_norm: float, scale: float, num_params: int, beta: float = 0.0
) -> tuple[float, float]:
    """ℓ1 and ℓ2 sensitivity of one clipped vector after scaling and randomized rounding.

    A vector of ℓ2 norm ≤ ``clipping_norm`` is multiplied by ``scale`` and each of its
    ``num_params`` coordinates is rounded up or down at random. Rounding moves each coordinate
    by < 1, so ``Δ2 = sC + √d`` always; with *conditional* rounding (re-round until the norm
    is below the bound; failure probability ``beta``) also
    ``Δ2 ≤ √((sC)² + d/4 + √(2 ln(1/β)) (sC + √d/2))`` (KLS21 Thm 1). For an integer vector
    ``‖x‖1 ≤ min(√d ‖x‖2, ‖x‖2²)``.

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
    from fedpriv.skellam import rounded_norm_bound  # the mechanism's own bound: one formula

    l2 = rounded_norm_bound(int(num_params), scale * clipping_norm, beta)
    l1 = l2 * min(math.sqrt(num_params), l2)
    return l1, l2


def scale_for_bits(
    bits: int,
    num_clients: int,
    num_params: int,
    noise_stddev: float,
    signal_norm: float,
    k: float = 4.0,
) -> float:
    """Largest scale ``s`` whose modular sum of ``bits`` bits does not wrap (k std devs).

    The scaled sum per coordinate (after a flattening rotation) has variance about
    ``s²(signal_norm²/d + noise_stddev²) + num_clients/4`` (signal, noise, rounding), and it
    must stay within ``±2**(bits-1)`` for ``k`` standard deviations (AKL21 §4, as in their
    ``skellam_params``):  ``s = √((4**(bits-1)/k² − N/4) / (signal²/d + σ²))``.

    Parameters
    ----------
    bits : int
        Bit width of the modular sum, 2..64.
    num_clients : int
        N clients whose rounded vectors are summed.
    num_params : int
        Dimension d.
    noise_stddev : float
        Total noise std in unscaled units (σ·C for noise multiplier σ).
    signal_norm : float
        ℓ2 bound of the summed signal in unscaled units (N·C if each client sends one
        clipped vector; a DP-SGD step sums the clipped per-sample gradients of a batch).
    k : float
        Number of standard deviations that must fit.

    Raises
    ------
    ConfigError
        If the bit width leaves no room at all.
    """
    check(isinstance(bits, int) and 2 <= bits <= 64, "bits", bits, "must be an integer in [2, 64]")
    check(num_clients >= 1, "num_clients", num_clients, "must be >= 1")
    var_unit = signal_norm**2 / num_params + noise_stddev**2
    room = 4.0 ** (bits - 1) / k**2 - num_clients / 4.0
    if room <= 0 or var_unit <= 0:
        raise ConfigError("bits", bits, f"is too small for {num_clients} clients (no scale fits)")
    return math.sqrt(room / var_unit)


@dataclasses.dataclass(frozen=True)
class SkellamEvent(FedprivEvent):
    """One (optionally Poisson-subsampled) Skellam release, in scaled integer units.

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

    composes_by_rdp: ClassVar[bool] = True

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

    def epsilon(self, target_delta: float, count: int = 1, conversion: str = "default") -> float:
        """ε of ``count`` releases at ``target_delta`` (integer orders)."""
        orders = MIRONOV_ORDERS if conversion == "mironov" else INTEGER_ORDERS
        return max(0.0, rdp_to_epsilon(orders, count * self.rdp(orders), target_delta, conversion))

    def delta(self, target_epsilon: float, count: int = 1, conversion: str = "default") -> float:
        """δ of ``count`` releases at ``target_epsilon`` (integer orders)."""
        orders = MIRONOV_ORDERS if conversion == "mironov" else INTEGER_ORDERS
        return rdp_to_delta(orders, count * self.rdp(orders), target_epsilon, conversion)


@dataclasses.dataclass(frozen=True)
class SkellamConfig:
    """Skellam DP-SGD step: noise, clipping, quantization → :class:`SkellamEvent`.

    Parameters
    ----------
    noise_multiplier : float
        Total noise std (all clients) per unit clipping norm, > 0.
    num_params : int
        Model dimension d.
    sample_rate : float
        Poisson sampling rate q.
    max_grad_norm : float
        Per-sample clipping norm C, > 0 (default 1).
    bits : int
        Bit width of the modular secure sum.
    num_clients : int
        Clients whose vectors are summed (bit-width budget).
    scale : float, optional
        Scale s; derived from ``bits`` by :func:`scale_for_bits` when omitted.
    beta : float
        Conditional rounding parameter (0 = unconditional rounding).
    signal_norm : float, optional
        ℓ2 bound of the summed signal (default ``num_clients * max_grad_norm``).
    """

    noise_multiplier: float
    num_params: int
    sample_rate: float
    max_grad_norm: float = 1.0
    bits: int = 32
    num_clients: int = 1
    scale: float | None = None
    beta: float = 0.0
    signal_norm: float | None = None

    def __post_init__(self) -> None:
        check(
            math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0,
            "noise_multiplier",
            self.noise_multiplier,
            "must be a finite number > 0",
        )
        check(self.max_grad_norm > 0, "max_grad_norm", self.max_grad_norm, "must be > 0")
        check(self.num_params >= 1, "num_params", self.num_params, "must be >= 1")
        check(0 <= self.sample_rate <= 1, "sample_rate", self.sample_rate, "must be in [0, 1]")
        check(self.num_clients >= 1, "num_clients", self.num_clients, "must be >= 1")
        check(self.scale is None or self.scale > 0, "scale", self.scale, "must be > 0")

    @property
    def resolved_scale(self) -> float:
        """``scale``, or the largest one the bit width allows."""
        if self.scale is not None:
            return float(self.scale)
        signal = (
            self.signal_norm
            if self.signal_norm is not None
            else self.num_clients * self.max_grad_norm
        )
        return scale_for_bits(
            self.bits,
            self.num_clients,
            self.num_params,
            self.noise_multiplier * self.max_grad_norm,
            signal,
        )

    def event(self) -> SkellamEvent:
        """The :class:`SkellamEvent` of one step (μ = (s σ C)² / 2)."""
        s = self.resolved_scale
        l1, l2 = rounded_sensitivities(self.max_grad_norm, s, self.num_params, self.beta)
        mu = (s * self.noise_multiplier * self.max_grad_norm) ** 2 / 2.0
        return SkellamEvent(
            mu=mu, l1_sensitivity=l1, l2_sensitivity=l2, sample_rate=self.sample_rate
        )


SKELLAM_KEYS = ("num_params", "max_grad_norm", "bits", "scale", "beta", "signal_norm")
KEYS = (
    "noise_multiplier",
    "target_epsilon",
    "num_clients",
    "sample_rate",
    "steps",
    "target_delta",
    "accountant",
    "conversion",
    *SKELLAM_KEYS,
)


def skellam_config_from_params(
    p: Params, noise_multiplier: float, num_clients: int
) -> SkellamConfig:
    """Read the Skellam-specific keys (bits, num_params, max_grad_norm, scale, beta, signal_norm)."""
    return SkellamConfig(
        noise_multiplier=noise_multiplier,
        max_grad_norm=p.float("max_grad_norm", 1.0, gt=0.0),
        num_params=p.int("num_params", ge=1),
        sample_rate=p.float("sample_rate", ge=0.0, le=1.0),
        bits=p.int("bits", 32, ge=2, le=64),
        num_clients=num_clients,
        scale=p.float("scale", None, gt=0.0),
        beta=p.float("beta", 0.0, ge=0.0, lt=1.0),
        signal_norm=p.float("signal_norm", None, gt=0.0),
    )


def run_cli(params: dict[str, str]) -> dict[str, Any]:
    """``fedpriv-account skellam``: noise_multiplier | target_epsilon, bits, num_params,
    num_clients, sample_rate, steps, max_grad_norm, target_delta [, conversion, scale, beta,
    signal_norm]."""
    from fedpriv.accounting.calibrate import bisect_noise

    p = Params(params, "skellam", KEYS)
    given = p.exclusive("noise_multiplier", "target_epsilon")
    num_clients = p.int("num_clients", 1, ge=1)
    steps = p.int("steps", ge=1)
    delta = p.delta("target_delta")
    conversion = p.choice("conversion", CONVERSIONS, "default")
    p.choice("accountant", ["rdp"], "rdp")
    probe = skellam_config_from_params(p, 1.0, num_clients)

    def eps_of(sigma: float) -> float:
        return (
            dataclasses.replace(probe, noise_multiplier=sigma)
            .event()
            .epsilon(delta, steps, conversion)
        )

    out: dict[str, Any] = {"analysis": "skellam"}
    if given == "target_epsilon":
        target = p.float("target_epsilon", gt=0.0)
        p.finish()
        sigma = bisect_noise(eps_of, target)
        out.update(calibrated="noise_multiplier", target_epsilon=target)
    else:
        sigma = p.float("noise_multiplier", gt=0.0)
        p.finish()
    cfg = dataclasses.replace(probe, noise_multiplier=sigma)
    ev = cfg.event()
    out.update(
        epsilon=ev.epsilon(delta, steps, conversion),
        delta=delta,
        noise_multiplier=sigma,
        mu=ev.mu,
        scale=cfg.resolved_scale,
        l1_sensitivity=ev.l1_sensitivity,
        l2_sensitivity=ev.l2_sensitivity,
        bits=cfg.bits,
        num_params=cfg.num_params,
        num_clients=num_clients,
        sample_rate=cfg.sample_rate,
        steps=steps,
        max_grad_norm=cfg.max_grad_norm,
        beta=cfg.beta,
        accountant="rdp",
        conversion=conversion,
        neighboring_relation="add_remove",
    )
    return out
