"""The Skellam mechanism on integers, ready for secure aggregation modulo ``2**bits``.

A client's real vector ``x`` (length ``dim``) becomes an integer vector in four steps
(Agarwal, Kairouz, Liu 2021, "The Skellam Mechanism for Differentially Private Federated
Learning", Alg. 1; the rounding and rotation of Kairouz, Liu, Steinke 2021, "The Distributed
Discrete Gaussian Mechanism", §4):

1. clip ``x`` to ℓ2 norm ``clipping_norm`` C;
2. optionally rotate it with a randomized Hadamard transform ``H D x / sqrt(n)`` (zero-padded
   to the next power of two ``n``; ``D`` a random ±1 diagonal from a public per-round seed);
3. scale by ``scale`` s and round each coordinate randomly to one of its two neighbouring
   integers (unbiased), re-drawing the rounding until the rounded vector's ℓ2 norm is at most
   :attr:`SkellamMechanism.l2_sensitivity` (conditional randomized rounding, DDGauss eq. (2)
   / Prop. 22 with ``beta``), so that norm bound holds with certainty;
4. add this client's share ``Sk(mu / m) = Pois(mu / m) − Pois(mu / m)`` per coordinate, with
   ``m = num_clients − dropout_tolerance − [honest_but_curious]``: any ``m`` clients' shares
   already sum to ``Sk(mu)`` (Skellam is infinitely divisible), and then reduce modulo
   ``2**bits``.

The aggregator adds the clients' residues; :meth:`SkellamMechanism.decode_sum` reduces the sum
modulo ``2**bits``, maps it to signed values in ``[-2**(bits-1), 2**(bits-1))``, divides by s
and undoes the rotation. Decoding is exact as long as every coordinate of the true integer
sum lies in that signed range. The scale follows one of two rules
(:mod:`fedpriv.mechanisms.modular_range`): ``probabilistic`` (default, with rotation: the range
holds ``wrap_stddevs`` standard deviations of a coordinate; :attr:`SkellamMechanism.wrap_bound`
bounds the probability that one wraps) or ``no_wrap`` (the sum cannot wrap). The constructor
refuses a scale the rule does not allow and names the number of bits that would be needed.

Poisson variates come from :meth:`numpy.random.Generator.poisson`, which returns exact int64
samples for every rate numpy accepts (it rejects rates above about 9.2e18);
``torch.poisson`` works in floating point and cannot return every integer above 2**24
(float32), so it is not used. numpy's PCG64 is not a cryptographic generator: for deployment
draw ``rng`` from OS entropy (``rng=None``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import linalg

from fedpriv.common.errors import ConfigError, check
from fedpriv.common.validate import parse_enum
from fedpriv.mechanisms.modular_range import (
    DEFAULT_WRAP_STDDEVS,
    ScaleRule,
    SignalGrowth,
    coordinate_tail_bound,
    probabilistic_scale,
    signed_reach,
)

#: Largest Poisson mean drawn: numpy's sampler (PTRS) is measured 2 % too wide in std at
#: λ = 1e15 and 9 % at 3.5e15 (200k draws), within 0.3 % up to 1e14; a share's μ is kept
#: <= 1e13, where the rounding error (variance <= 1/4) is still ~1e-13 of the noise variance.
MAX_POISSON_MEAN = 1e13
DEFAULT_BETA = math.exp(-0.5)  # Kairouz et al. 2021 and Agarwal et al. 2021, experiments
MAX_BITS = 62  # residues and sums of a few clients stay inside int64
_MAX_ROUNDING_TRIES = 10_000


def rounded_norm_bound(dim: int, norm_bound: float, beta: float = DEFAULT_BETA) -> float:
    """ℓ2 bound after conditional randomized rounding of a vector of norm ≤ ``norm_bound``.

    ``min(c + sqrt(d), sqrt(c² + d/4 + sqrt(2 ln(1/β)) (c + sqrt(d)/2)))`` with ``c`` =
    ``norm_bound`` (integer units) and ``d`` = ``dim``. The first term is a deterministic bound
    (each coordinate moves by less than 1); the second holds for one unconditioned rounding
    with probability at least ``1 - beta``, so conditional rounding needs on average at most
    ``1 / (1 - beta)`` draws.

    References
    ----------
    Kairouz, Liu, Steinke 2021 (DDGauss), Thm. 1 eq. (2) and Prop. 22; Agarwal et al. 2021 §4.
    """
    c, d = float(norm_bound), float(dim)
    bound1 = c + math.sqrt(d)
    if beta <= 0.0:
        return bound1
    squared2 = c * c + 0.25 * d + math.sqrt(2.0 * math.log(1.0 / beta)) * (c + 0.5 * math.sqrt(d))
    return min(bound1, math.sqrt(squared2))


def skellam_tail_bound(mu: float, t: float) -> float:
    """Chernoff bound on ``P(X >= t)`` for ``X ~ Sk(mu)`` (= ``P(X <= -t)``), ``t >= 0``.

    ``Sk(mu)`` has moment generating function ``exp(2 mu (cosh λ − 1))``; the optimal
    ``λ = asinh(t / (2 mu))`` gives ``exp(-(t asinh(t/(2mu)) − sqrt(t² + 4mu²) + 2mu))``.
    """
    if t <= 0:
        return 1.0
    exponent = t * math.asinh(t / (2.0 * mu)) - math.hypot(t, 2.0 * mu) + 2.0 * mu
    return math.exp(-exponent)


def skellam_tail_threshold(mu: float, probability: float) -> int:
    """Smallest integer ``t`` with ``P(|Sk(mu)| >= t) <= probability`` by the Chernoff bound."""
    hi = 1.0
    while 2.0 * skellam_tail_bound(mu, hi) > probability:
        hi *= 2.0
    lo = 0.0
    while hi - lo > 0.5:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if 2.0 * skellam_tail_bound(mu, mid) > probability else (lo, mid)
    return int(math.ceil(hi))


def sample_skellam(
    mu: float, size: int | tuple[int, ...], rng: np.random.Generator
) -> NDArray[np.int64]:
    """Exact ``Sk(mu) = Pois(mu) − Pois(mu)`` variates, int64, of shape ``size``.

    Raises
    ------
    ConfigError
        If ``mu`` is not > 0 or is beyond numpy's exact Poisson range.
    """
    check(
        0 < mu <= MAX_POISSON_MEAN,
        "mu",
        mu,
        f"must be in (0, {MAX_POISSON_MEAN:g}] (numpy's Poisson sampler is inexact beyond)",
    )
    return rng.poisson(mu, size).astype(np.int64) - rng.poisson(mu, size).astype(np.int64)


def centered_mod(values: ArrayLike, bits: int) -> NDArray[np.int64]:
    """``values`` modulo ``2**bits`` as signed int64 in ``[-2**(bits-1), 2**(bits-1))``."""
    modulus = 1 << bits
    v = np.mod(np.asarray(values, dtype=np.int64), modulus)
    return np.where(v >= modulus >> 1, v - modulus, v).astype(np.int64)


@functools.lru_cache(maxsize=8)
def _hadamard(n: int) -> NDArray[np.float64]:
    """Sylvester's Hadamard matrix of order ``n`` (a power of two), float64, read-only."""
    h: NDArray[np.float64] = linalg.hadamard(n).astype(np.float64)
    h.flags.writeable = False
    return h


#: log2 of the Hadamard factors of :func:`_fwht` (32 × 32 products: fastest measured here).
_FWHT_FACTOR_BITS = 5


def _fwht(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """Unnormalised Walsh–Hadamard transform along the last axis (length a power of two).

    ``H_n = H_f1 ⊗ H_f2 ⊗ ...`` (Sylvester): each pass multiplies the lowest group of index bits
    by a small ``H_f`` (one BLAS product) and moves it to the front; after the last pass the
    groups are back in order. 10x faster than the butterfly for (512, 32768) here.
    """
    n = x.shape[-1]
    y = x.reshape(-1, n)
    bits = n.bit_length() - 1
    while bits > 0:
        f = 1 << min(_FWHT_FACTOR_BITS, bits)
        bits -= f.bit_length() - 1
        z = (y.reshape(-1, f) @ _hadamard(f)).reshape(y.shape[0], n // f, f)
        y = np.ascontiguousarray(z.transpose(0, 2, 1)).reshape(-1, n)
    return y.reshape(x.shape)


def _signs(n: int, seed: int) -> NDArray[np.float64]:
    """The public ±1 diagonal ``D`` of the rotation, from the per-round ``seed``."""
    return np.where(np.random.default_rng(seed).random(n) < 0.5, -1.0, 1.0)


def _clip_rows(x: NDArray[np.float64], clipping_norm: float) -> NDArray[np.float64]:
    """Each row scaled to ℓ2 norm ≤ ``clipping_norm`` (all-zero rows unchanged)."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    factor = np.minimum(1.0, clipping_norm / np.maximum(norms, 1e-300))
    out: NDArray[np.float64] = x * factor
    return out


def _row_sq_norms(a: NDArray[np.float64]) -> NDArray[np.float64]:
    """Squared ℓ2 norm of each row (exact for integer rows of squared norm below 2**53)."""
    out: NDArray[np.float64] = np.einsum("ij,ij->i", a, a)
    return out


def conditional_round(
    v: NDArray[np.float64], bound: float, rng: np.random.Generator
) -> NDArray[np.int64]:
    """Unbiased randomized rounding of each row of ``v`` (shape ``(B, n)``), re-drawn until
    its ℓ2 norm is ≤ ``bound`` (DDGauss §4, "conditional randomized rounding").

    Raises
    ------
    RuntimeError
        If a row still exceeds ``bound`` after many draws (``bound`` below the row's reach).
    """
    low = np.floor(v)
    frac = v - low  # exact in float64
    out = low + (rng.random(v.shape) < frac)
    bad = _row_sq_norms(out) > bound * bound
    for _ in range(_MAX_ROUNDING_TRIES):
        if not bad.any():
            return out.astype(np.int64)
        idx = np.flatnonzero(bad)
        out[idx] = low[idx] + (rng.random((idx.size, v.shape[1])) < frac[idx])
        bad[idx] = _row_sq_norms(out[idx]) > bound * bound
    raise RuntimeError(
        f"conditional rounding did not reach norm {bound} in {_MAX_ROUNDING_TRIES} draws"
    )


def as_generator(rng: np.random.Generator | int | None) -> np.random.Generator:
    """``rng`` itself, a seeded PCG64 for an int, or OS entropy for ``None``."""
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


@dataclass(frozen=True)
class SkellamMechanism:
    """Scale, rotate, round, add a Skellam share, reduce modulo ``2**bits``; and decode.

    Parameters
    ----------
    bits : int
        Width of the secure sum: residues live in ``[0, 2**bits)``; 2 ≤ bits ≤ 62.
    scale : float
        s > 0: real units × s = integer units.
    mu : float
        Skellam parameter of the aggregated noise per release, in integer units (> 0): the sum
        of any ``noise_divisor`` clients' shares is ``Sk(mu)``, per coordinate.
    clipping_norm : float
        ℓ2 clip C of each encoded vector, real units (> 0).
    num_clients : int
        N, clients whose residues are summed (≥ 1).
    dim : int
        Length of the real vectors (≥ 1).
    rotation : bool
        Apply the randomized Hadamard rotation (pads to the next power of two); required by
        ``scale_rule=probabilistic``.
    honest_but_curious : bool
        Size shares so that N − 1 clients suffice (a client may subtract its own noise).
    dropout_tolerance : int
        Clients that may drop out while the survivors' noise still sums to ``Sk(mu)``.
    beta : float
        Conditional-rounding parameter in [0, 1) (DDGauss eq. (2)); 0 uses ``c + sqrt(n)``.
    steps : int
        Noise shares each client adds into one message (its local steps per round).
    max_summands : int
        Most rounded vectors a client sums into one message (e.g. steps × local data size for
        per-sample rounding in DP-SGD; 1 for one clipped update per client).
    wrap_probability : float
        ``no_wrap``: allowed probability that some coordinate of the aggregated sum leaves the
        signed range (union bound over coordinates, Chernoff tail of the noise).
    scale_rule : ScaleRule
        ``probabilistic`` (default) or ``no_wrap``: the range a scale must respect.
    wrap_stddevs : float
        k > 0 of the probabilistic rule: the range holds k standard deviations of a summed
        coordinate (default 3, as the reference implementation).
    signal_growth : SignalGrowth
        Norm bound of the summed signal for the probabilistic rule (``linear``: any data).
    summand_tail : float
        Probability in [0, 1) that some client sums more than ``max_summands`` vectors (a
        high-probability ``max_summands``); added to :attr:`wrap_bound`.

    Raises
    ------
    ConfigError
        For out-of-range fields, ``scale_rule=probabilistic`` without rotation, and ``bits``
        too small for the rule at this scale (the message names the bits needed).

    References
    ----------
    Agarwal, Kairouz, Liu 2021, Alg. 1 and Thm. 3.5; Kairouz, Liu, Steinke 2021, §4-5.
    """

    bits: int
    scale: float
    mu: float
    clipping_norm: float
    num_clients: int
    dim: int
    rotation: bool = True
    honest_but_curious: bool = False
    dropout_tolerance: int = 0
    beta: float = DEFAULT_BETA
    steps: int = 1
    max_summands: int = 1
    wrap_probability: float = 1e-9
    scale_rule: ScaleRule = ScaleRule.PROBABILISTIC
    wrap_stddevs: float = DEFAULT_WRAP_STDDEVS
    signal_growth: SignalGrowth = SignalGrowth.LINEAR
    summand_tail: float = 0.0

    def __post_init__(self) -> None:
        check(
            isinstance(self.bits, int) and 2 <= self.bits <= MAX_BITS,
            "bits",
            self.bits,
            f"must be an integer in [2, {MAX_BITS}]",
        )
        check(math.isfinite(self.scale) and self.scale > 0, "scale", self.scale, "must be > 0")
        check(math.isfinite(self.mu) and self.mu > 0, "mu", self.mu, "must be > 0")
        check(
            math.isfinite(self.clipping_norm) and self.clipping_norm > 0,
            "clipping_norm",
            self.clipping_norm,
            "must be > 0",
        )
        check(self.num_clients >= 1, "num_clients", self.num_clients, "must be >= 1")
        check(self.dim >= 1, "dim", self.dim, "must be >= 1")
        check(
            self.dropout_tolerance >= 0, "dropout_tolerance", self.dropout_tolerance, "must be >= 0"
        )
        check(
            self.noise_divisor >= 1,
            "num_clients",
            self.num_clients,
            "must exceed dropout_tolerance (+1 if honest_but_curious)",
        )
        check(0.0 <= self.beta < 1.0, "beta", self.beta, "must be in [0, 1)")
        check(self.steps >= 1, "steps", self.steps, "must be >= 1")
        check(self.max_summands >= 1, "max_summands", self.max_summands, "must be >= 1")
        check(
            0.0 < self.wrap_probability < 1.0,
            "wrap_probability",
            self.wrap_probability,
            "must be in (0, 1)",
        )
        self._check_rule()
        check(
            self.mu_per_client <= MAX_POISSON_MEAN,
            "mu",
            self.mu,
            f"gives a per-client share beyond {MAX_POISSON_MEAN:g} (numpy's Poisson sampler is "
            "inexact beyond: use a smaller scale)",
        )
        needed = self.required_bits
        if self.bits < needed:
            raise ConfigError(
                "bits", self.bits, f"is too small: {self.range_note}; need bits >= {needed}"
            )

    def _check_rule(self) -> None:
        """Refuse a rule's fields out of range (ConfigError naming the ``client.`` key)."""
        rule = parse_enum(ScaleRule, "client.scale_rule", self.scale_rule)
        object.__setattr__(self, "scale_rule", rule)
        growth = parse_enum(SignalGrowth, "client.signal_growth", self.signal_growth)
        object.__setattr__(self, "signal_growth", growth)
        check(
            math.isfinite(self.wrap_stddevs) and self.wrap_stddevs > 0,
            "client.wrap_stddevs",
            self.wrap_stddevs,
            "must be a finite number > 0",
        )
        check(0 <= self.summand_tail < 1, "summand_tail", self.summand_tail, "must be in [0, 1)")
        check(
            rule is ScaleRule.NO_WRAP or self.rotation,
            "client.rotation",
            self.rotation,
            "must be true with client.scale_rule=probabilistic (without the rotation one "
            "coordinate can carry a vector's whole norm): set client.rotation=true or "
            "client.scale_rule=no_wrap",
        )

    # ---- sizes and bounds -------------------------------------------------------------
    @property
    def padded_dim(self) -> int:
        """n: ``dim`` rounded up to a power of two with rotation, else ``dim``."""
        return 1 << (self.dim - 1).bit_length() if self.rotation else self.dim

    @property
    def noise_divisor(self) -> int:
        """m = N − dropout_tolerance − [honest_but_curious]: shares that must add to Sk(mu)."""
        return self.num_clients - self.dropout_tolerance - int(self.honest_but_curious)

    @property
    def mu_per_client(self) -> float:
        """One client's share ``mu / m`` per release."""
        return self.mu / self.noise_divisor

    @property
    def l2_sensitivity(self) -> float:
        """Δ2: ℓ2 bound of one rounded vector (integer units) — guaranteed by the rounding."""
        return rounded_norm_bound(self.padded_dim, self.scale * self.clipping_norm, self.beta)

    @property
    def l1_sensitivity(self) -> float:
        """Δ1 = min(Δ2², sqrt(n) Δ2): ℓ1 bound of an integer vector of ℓ2 norm ≤ Δ2."""
        d2 = self.l2_sensitivity
        return min(d2 * d2, math.sqrt(self.padded_dim) * d2)

    @property
    def signal_bound(self) -> int:
        """Bound on |coordinate| of the summed rounded vectors (no noise), integer units.

        Each rounded coordinate is at most ``min(Δ2, floor(s C) + 1)`` in magnitude; N clients
        each add at most ``max_summands`` of them.
        """
        per_vector = min(
            math.floor(self.l2_sensitivity), math.floor(self.scale * self.clipping_norm) + 1
        )
        return self.num_clients * self.max_summands * per_vector

    @property
    def total_noise_mu(self) -> float:
        """μ of the noise in the summed messages: ``steps`` shares of all N clients."""
        return self.steps * self.num_clients * self.mu_per_client

    @property
    def noise_tail(self) -> int:
        """t with P(max_j |noise_j| ≥ t) ≤ wrap_probability for the sum of all N clients' noise."""
        return skellam_tail_threshold(self.total_noise_mu, self.wrap_probability / self.padded_dim)

    @property
    def signal_unit_variance(self) -> float:
        """``(C G)²/n``: the rotated signal's variance proxy per coordinate and per unit
        scale², with ``G`` the norm bound of ``V = N × max_summands`` vectors in units of C."""
        vectors = self.num_clients * self.max_summands
        norm = self.clipping_norm * self.signal_growth.norm_units(vectors)
        return norm * norm / self.padded_dim

    @property
    def rounding_variance(self) -> float:
        """``V/4``: the variance bound of the ``V`` rounding errors in one coordinate."""
        return self.num_clients * self.max_summands / 4.0

    @property
    def signal_variance(self) -> float:
        """Sub-Gaussian variance proxy of one coordinate of the summed, rotated, rounded
        vectors (integer units): ``s² (C G)²/n + V/4``."""
        return self.scale**2 * self.signal_unit_variance + self.rounding_variance

    @property
    def coordinate_std(self) -> float:
        """Standard deviation (bound) of one coordinate of the summed messages, integer
        units: ``sqrt(signal_variance + 2 total_noise_mu)``."""
        return math.sqrt(self.signal_variance + 2.0 * self.total_noise_mu)

    @property
    def wrap_bound(self) -> float:
        """Bound on the probability that one coordinate of the sum wraps.

        ``probabilistic``: twice the Chernoff bound of :func:`coordinate_tail_bound` at
        ``R + 1 = 2**(bits-1)`` (:func:`~fedpriv.mechanisms.modular_range.signed_reach`: the
        probability of leaving ``[-R, R]``, which holds every value the rule's ``k`` standard
        deviations reach and contains every wrap), plus ``summand_tail`` (a bound under
        ``signal_growth=linear``; under ``sqrt`` it holds for vectors in independent
        directions). ``no_wrap``:
        ``wrap_probability / n`` (the noise tail's share of one coordinate).
        """
        if self.scale_rule is ScaleRule.NO_WRAP:
            return self.wrap_probability / self.padded_dim
        beyond = float(signed_reach(self.bits) + 1)
        tail = coordinate_tail_bound(beyond, self.signal_variance, self.total_noise_mu)
        return min(1.0, 2.0 * tail + self.summand_tail)

    @property
    def range_note(self) -> str:
        """What the range must hold under the rule, for error messages."""
        if self.scale_rule is ScaleRule.NO_WRAP:
            return (
                f"the modular sum of {self.num_clients} clients could wrap (signal bound "
                f"{self.signal_bound}, noise tail {self.noise_tail})"
            )
        return (
            f"{self.wrap_stddevs:g} standard deviations of a summed coordinate "
            f"({self.wrap_stddevs * self.coordinate_std:.6g}) exceed 2**(bits-1) - 1"
        )

    @property
    def required_bits(self) -> int:
        """Smallest ``bits`` for the rule: ``no_wrap``: ``signal_bound + noise_tail <=
        2**(bits-1) - 1``; ``probabilistic``: ``k × coordinate_std <= 2**(bits-1) - 1`` (to
        1e-12 relative, the closed-form scale's rounding): the same reach
        (:func:`~fedpriv.mechanisms.modular_range.signed_reach`) both ways."""
        if self.scale_rule is ScaleRule.NO_WRAP:
            return (self.signal_bound + self.noise_tail).bit_length() + 1
        reach = self.wrap_stddevs * self.coordinate_std / (1.0 + 1e-12)
        return max(2, math.ceil(math.log2(reach + 1.0)) + 1)

    def wrapped_coordinates(self, signed_sum: ArrayLike) -> int:
        """How many coordinates of the TRUE integer sum (not reduced) lie outside
        ``[-2**(bits-1), 2**(bits-1))``: those the modular decoding gets wrong."""
        arr = np.asarray(signed_sum, dtype=np.int64)
        half = 1 << (self.bits - 1)
        return int(np.count_nonzero((arr < -half) | (arr >= half)))

    @property
    def modulus(self) -> int:
        """``2**bits``."""
        return 1 << self.bits

    # ---- client side ------------------------------------------------------------------
    def rotate(self, x: NDArray[np.float64], seed: int) -> NDArray[np.float64]:
        """``H D pad(x) / sqrt(n)`` row-wise (orthonormal: norms are kept); shape ``(..., n)``."""
        n = self.padded_dim
        padded = np.zeros(x.shape[:-1] + (n,))
        padded[..., : x.shape[-1]] = x
        return _fwht(padded * _signs(n, seed)) / math.sqrt(n)

    def unrotate(self, y: NDArray[np.float64], seed: int) -> NDArray[np.float64]:
        """Inverse of :meth:`rotate`, truncated to ``dim``: ``(D H y / sqrt(n))[..., :dim]``."""
        n = self.padded_dim
        return (_fwht(y) * _signs(n, seed) / math.sqrt(n))[..., : self.dim]

    def quantize(
        self, x: ArrayLike, rng: np.random.Generator | int | None, seed: int | None = None
    ) -> NDArray[np.int64]:
        """Clip, rotate, scale and conditionally round each row of ``x``; no noise.

        Parameters
        ----------
        x : array_like
            Real vectors, shape ``(dim,)`` or ``(B, dim)`` (e.g. per-sample gradients).
        rng : numpy Generator, int or None
            Randomness of the rounding.
        seed : int, optional
            Public rotation seed of the round (required when ``rotation``).

        Returns
        -------
        numpy.ndarray
            int64, shape ``(n,)`` or ``(B, n)``; each row's ℓ2 norm ≤ :attr:`l2_sensitivity`.

        Raises
        ------
        ValueError
            If ``x`` holds NaN or ±inf: rounding it would send arbitrary integers, which no
            aggregator could tell from a valid share (the client's reply then fails and it
            counts as dropped).
        """
        arr = np.asarray(x, dtype=np.float64)
        if not np.isfinite(arr).all():
            raise ValueError("non-finite values in the Skellam mechanism's input (NaN or inf)")
        single = arr.ndim == 1
        rows = arr.reshape(1, -1) if single else arr
        check(
            rows.ndim == 2 and rows.shape[1] == self.dim,
            "x.shape",
            arr.shape,
            f"must be ({self.dim},) or (B, {self.dim})",
        )
        rows = _clip_rows(rows, self.clipping_norm)
        if self.rotation:
            check(seed is not None, "seed", seed, "is required when rotation=True")
            rows = self.rotate(rows, int(seed))  # type: ignore[arg-type]
        out = conditional_round(rows * self.scale, self.l2_sensitivity, as_generator(rng))
        return out[0] if single else out

    def noise(self, rng: np.random.Generator | int | None) -> NDArray[np.int64]:
        """One client's share ``Sk(mu / m)`` per coordinate, int64, shape ``(n,)``."""
        return sample_skellam(self.mu_per_client, self.padded_dim, as_generator(rng))

    def privatize(
        self, x: ArrayLike, rng: np.random.Generator | int | None, seed: int | None = None
    ) -> NDArray[np.int64]:
        """Signed integer release of one step: sum of the quantized rows of ``x`` plus a share.

        Returns int64 of shape ``(n,)`` (not yet reduced modulo ``2**bits``).
        """
        gen = as_generator(rng)
        q = self.quantize(x, gen, seed)
        total = q if q.ndim == 1 else q.sum(axis=0)
        return total + self.noise(gen)

    def to_residues(self, z: ArrayLike) -> NDArray[np.int64]:
        """``z mod 2**bits`` as int64 in ``[0, 2**bits)`` (what a client sends)."""
        return np.mod(np.asarray(z, dtype=np.int64), self.modulus).astype(np.int64)

    def encode(
        self, x: ArrayLike, rng: np.random.Generator | int | None, seed: int | None = None
    ) -> NDArray[np.int64]:
        """``to_residues(privatize(x))``: a client's message for one release."""
        return self.to_residues(self.privatize(x, rng, seed))

    def decode_signed(self, z: ArrayLike, seed: int | None = None) -> NDArray[np.float64]:
        """Real vector ``(dim,)`` of a signed integer vector ``z`` (``(n,)``): unscale, unrotate.

        A client uses it on its own release to take its local step; no modular reduction.
        """
        y = np.asarray(z, dtype=np.float64) / self.scale
        if self.rotation:
            check(seed is not None, "seed", seed, "is required when rotation=True")
            return self.unrotate(y, int(seed))  # type: ignore[arg-type]
        return y

    def decode_sum(self, total: ArrayLike, seed: int | None = None) -> NDArray[np.float64]:
        """Real sum ``(dim,)`` from the (modular or plain) sum of the clients' residues.

        Reduces modulo ``2**bits``, maps to ``[-2**(bits-1), 2**(bits-1))``, unscales and
        unrotates. Exact unless the true signed sum wrapped (probability ≤ wrap_probability
        for inputs within the configured bounds).
        """
        arr = np.asarray(total)
        check(
            arr.shape == (self.padded_dim,),
            "total.shape",
            arr.shape,
            f"must be ({self.padded_dim},)",
        )
        check(
            np.issubdtype(arr.dtype, np.integer),
            "total.dtype",
            arr.dtype,
            "must be an integer type",
        )
        return self.decode_signed(centered_mod(arr, self.bits), seed)

    # ---- choosing the scale -----------------------------------------------------------
    @classmethod
    def from_noise_multiplier(cls, noise_multiplier: float, **fields: Any) -> SkellamMechanism:
        """The mechanism with the largest ``scale`` its rule allows, for a noise multiplier σ:
        ``mu = (s σ C)² / 2``, i.e. total noise std ``s σ C`` per step in integer units (σ C in
        real units, like the Gaussian it replaces).

        ``probabilistic``: the closed form of :func:`~fedpriv.mechanisms.modular_range.
        probabilistic_scale`; ``no_wrap``: bisection on log2(s) to 1e-3. Both are capped where
        a client's Poisson mean would pass :data:`MAX_POISSON_MEAN`.

        Parameters
        ----------
        noise_multiplier : float
            σ > 0, total noise std over ``clipping_norm``.
        **fields
            Every other field except ``scale`` and ``mu`` (``bits``, ``clipping_norm``,
            ``num_clients``, ``dim``, ``scale_rule``, ...).

        Raises
        ------
        ConfigError
            If ``noise_multiplier`` is not > 0, or no scale fits in ``bits``.
        """
        check(
            math.isfinite(noise_multiplier) and noise_multiplier > 0,
            "noise_multiplier",
            noise_multiplier,
            "must be > 0",
        )
        sigma_c = noise_multiplier * float(fields["clipping_norm"])

        def build(s: float) -> SkellamMechanism:
            return cls(scale=s, mu=(s * sigma_c) ** 2 / 2.0, **fields)

        try:
            probe = build(2.0**-60)  # validates the fields; the smallest scale considered
        except ConfigError as exc:
            if exc.field != "bits":
                raise
            raise ConfigError(
                "bits", fields.get("bits"), f"leaves no room for any scale ({exc})"
            ) from None
        cap = math.sqrt(2.0 * MAX_POISSON_MEAN * probe.noise_divisor) / sigma_c * (1 - 1e-12)
        if probe.scale_rule is ScaleRule.PROBABILISTIC:  # v(s) = s² per_unit + V/4
            shares = probe.steps * probe.num_clients / probe.noise_divisor  # noise: s²σ²C² each
            per_unit = probe.signal_unit_variance + shares * sigma_c**2
            room = probabilistic_scale(
                probe.bits, probe.wrap_stddevs, per_unit, probe.rounding_variance
            )
            scale = min(cap, room)
            if scale <= 0:
                raise ConfigError(
                    "bits", probe.bits, f"leaves no room for any scale: {probe.range_note}"
                )
            return build(scale)
        lo, hi = -60.0, 64.0  # the constructor refuses a scale past the Poisson cap
        while hi - lo > 1e-3:
            mid = 0.5 * (lo + hi)
            try:
                build(2.0**mid)
                lo = mid
            except ConfigError:
                hi = mid
        return build(2.0**lo)
