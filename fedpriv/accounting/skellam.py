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
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from scipy import special, stats

from fedpriv.accounting.core.calibrate import bisect_noise
from fedpriv.accounting.core.ledger import IntegerRdpEvent
from fedpriv.accounting.core.lower_report import LowerBound
from fedpriv.accounting.core.params import CliKeys
from fedpriv.accounting.core.privacy_spec import EventRuns, PrivacySpec, UnaccountableRound
from fedpriv.accounting.core.vocabulary import Accountant
from fedpriv.accounting.dpsgd import DPSGDSpec, LocalStepsSum
from fedpriv.common.errors import ConfigError, check
from fedpriv.common.validate import check_finite, check_positive, parse_enum
from fedpriv.mechanisms.modular_range import DEFAULT_WRAP_STDDEVS, ScaleRule, SignalGrowth
from fedpriv.mechanisms.skellam_noise import (
    DEFAULT_BETA,
    MAX_BITS,
    SkellamMechanism,
    rounded_norm_bound,
)

#: Probability that some client's Poisson batches hold more vectors than the high-probability
#: count the probabilistic rule sizes the range for (:func:`summands_bound`).
SUMMAND_TAIL = 1e-9


def _check_count(field: str, value: Any, low: int) -> None:
    """Refuse ``value`` unless it is an integer >= ``low`` (ConfigError naming ``field``)."""
    check(
        isinstance(value, int) and not isinstance(value, bool) and value >= low,
        field,
        value,
        f"must be an integer >= {low}",
    )


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
    return np.asarray(np.minimum(total / (a - 1), base), dtype=float)


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
    l2 = rounded_norm_bound(int(num_params), scale * clipping_norm, beta)
    l1 = l2 * min(math.sqrt(num_params), l2)
    return l1, l2


@dataclasses.dataclass(frozen=True)
class SkellamEvent(IntegerRdpEvent):
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


def summands_bound(
    rule: ScaleRule, draws: int, sample_rate: float, num_clients: int
) -> tuple[int, float]:
    """Rounded vectors one client sums into a message, and the probability that some client
    sums more: ``(draws, 0)`` for ``no_wrap`` (every record in every step); for
    ``probabilistic`` the smallest ``K`` with ``N P(Binomial(draws, q) > K) <= SUMMAND_TAIL``
    (Poisson batches), and that probability.

    Parameters
    ----------
    rule : ScaleRule
    draws : int
        ``steps × local_samples``: every record's chance to enter a batch, >= 1.
    sample_rate : float
        q in [0, 1].
    num_clients : int
        N >= 1 (union bound over the clients).
    """
    if rule is ScaleRule.NO_WRAP or sample_rate >= 1:
        return draws, 0.0
    k = int(stats.binom.isf(SUMMAND_TAIL / num_clients, draws, sample_rate))
    while k < draws and num_clients * stats.binom.sf(k, draws, sample_rate) > SUMMAND_TAIL:
        k += 1
    k = max(1, min(k, draws))
    return k, float(num_clients * stats.binom.sf(k, draws, sample_rate))


#: The mechanism's fields, bound by the client (``client.*``) and keys of ``fedpriv-account
#: skellam`` and ``secagg-dpsgd mechanism=skellam``.
MECHANISM_FIELDS = (
    "num_params",
    "bits",
    "scale",
    "beta",
    "rotation",
    "dropout_tolerance",
    "local_samples",
    "scale_rule",
    "wrap_stddevs",
    "signal_growth",
)
#: The answer's entries of the spec's summary (``fedpriv-account skellam``).
CLI_SUMMARY = (
    "noise_multiplier",
    "mu",
    "scale",
    "l1_sensitivity",
    "l2_sensitivity",
    "num_clients",
    "honest_but_curious",
    "sample_rate",
    "steps",
    "max_grad_norm",
    "bits",
    "num_params",
    "beta",
    "rotation",
    "dropout_tolerance",
    "local_samples",
    "scale_rule",
    "wrap_stddevs",
    "signal_growth",
    "wrap_bound",
    "accountant",
    "conversion",
)
#: Why ``lower_bound=true`` has no number for the Skellam analysis
#: (:meth:`SkellamSpec.lower_bound`).
NO_LOWER_BOUND = (
    "no realised pair is computed for the modular Skellam sum (rotation, conditional rounding "
    "and wrapping make the released pmfs unavailable here)"
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SkellamSpec(PrivacySpec, LocalStepsSum):
    """Multi-step local DP-SGD with Skellam noise on integers: THE object that picks the
    scale, builds the :class:`~fedpriv.mechanisms.skellam_noise.SkellamMechanism` and states
    its events.

    Built by the run's client algorithm (``clients.skellam_dpsgd.SkellamDPSGD``), by
    ``fedpriv-account skellam`` and by ``fedpriv-account secagg-dpsgd mechanism=skellam``, so a
    run's settings give the CLI exactly the run's ε. The scale is the largest that
    ``scale_rule`` allows (:meth:`SkellamMechanism.from_noise_multiplier`; ``probabilistic``:
    ``wrap_stddevs`` standard deviations of a summed coordinate, each client summing at most
    :func:`summands_bound` rounded vectors; ``no_wrap``: ``num_clients × steps ×
    local_samples`` rounded vectors plus the noise tail), unless ``scale`` is given. Per step
    the sum over clients carries
    ``Sk(μ)``, ``μ = (s σ C)² / 2``: one Poisson-subsampled Skellam release (RDP only).

    Parameters
    ----------
    noise_multiplier : float or None
        σ > 0 of the summed noise per unit clipping norm (real units), or ``None`` with
        ``target_epsilon`` (calibrated by the run). There is no non-private Skellam run: the
        scale follows σ.
    accountant : {"rdp"}
        The default and the only choice (the Skellam analysis is an RDP bound).
    bits : int
        Width of the modular secure sum, 2..62 (bound: ``client.bits``).
    num_params : int
        Model dimension d (>= 1 to build the mechanism; 0 = not bound yet).
    rotation : bool
        Randomized Hadamard rotation before rounding (bound: ``client.rotation``; required by
        the probabilistic rule).
    scale_rule : ScaleRule
        ``probabilistic`` (default) or ``no_wrap`` (bound: ``client.scale_rule``).
    wrap_stddevs : float
        k of the probabilistic rule, > 0 (bound: ``client.wrap_stddevs``).
    signal_growth : SignalGrowth
        ``linear`` or ``sqrt``: the summed signal's norm bound (bound: ``client.signal_growth``).
    beta : float
        Conditional rounding parameter in [0, 1) (bound: ``client.beta``).
    dropout_tolerance : int
        Clients that may drop out while the survivors' shares still sum to ``Sk(μ)`` (bound:
        ``client.dropout_tolerance``).
    local_samples : int
        Most records one client holds (its Poisson batches are subsets): with ``steps`` it
        bounds the rounded vectors a client sums into one message (wrap bound; bound by the
        run from its partition).
    scale : float, optional
        Explicit scale s (the mechanism refuses it if the sum could wrap); ``None``: the
        largest that cannot wrap.
    (and the fields of :class:`~fedpriv.accounting.dpsgd.LocalStepsSum`: sample_rate,
    max_grad_norm, honest_but_curious, steps, num_clients, normalizer; and of
    :class:`~fedpriv.accounting.core.privacy_spec.PrivacySpec`)

    Raises
    ------
    ConfigError
        For out-of-range or non-finite fields (``privacy.<field>``, ``client.<field>``),
        ``privacy.accountant=pld``, or ``bits`` too small (the message names the bits needed).

    References
    ----------
    Agarwal, Kairouz, Liu 2021, "The Skellam Mechanism for Differentially Private Federated
    Learning", arXiv:2110.04995, Thm 3.5; Steinke 2022, arXiv:2210.00597 (subsampling); the
    third paper, "On Using Secure Aggregation in Differentially Private Federated Learning with
    Multiple Local Steps" (Heikkilä), Theorem 4.6 (μ_total = Σ μ_i).
    """

    family: ClassVar[str] = "skellam"
    bound_fields: ClassVar[tuple[str, ...]] = (
        *DPSGDSpec.bound_fields,
        "bits",
        "num_params",
        "rotation",
        "beta",
        "dropout_tolerance",
        "local_samples",
        "scale",
        "scale_rule",
        "wrap_stddevs",
        "signal_growth",
    )

    cli: ClassVar[CliKeys] = CliKeys(
        doc="Skellam DP-SGD: epsilon of the run's SkellamSpec (noise_multiplier is sigma of "
        "the summed noise; RDP only), and one client's own local_epsilon",
        takes=("steps", "num_clients", *MECHANISM_FIELDS),
        required=("num_params",),
        defaults={"num_clients": 1},
        local_epsilon=True,
        summary=CLI_SUMMARY,
        report=lambda spec, n: no_wrap_cost(spec, n),
    )

    accountant: Accountant = Accountant.RDP
    bits: int = 32
    num_params: int = 0
    rotation: bool = True
    scale_rule: ScaleRule = ScaleRule.PROBABILISTIC
    wrap_stddevs: float = DEFAULT_WRAP_STDDEVS
    signal_growth: SignalGrowth = SignalGrowth.LINEAR
    beta: float = DEFAULT_BETA
    dropout_tolerance: int = 0
    local_samples: int = 1
    scale: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        noise = self.noise_or_target(self.noise_multiplier)
        check(
            noise is None or noise > 0,
            "privacy.noise_multiplier",
            noise,
            "must be > 0 for the Skellam mechanism (its scale follows the noise)",
        )
        object.__setattr__(self, "noise_multiplier", noise)
        self.check_local_steps()
        check(
            self.accountant is Accountant.RDP,
            "privacy.accountant",
            self.accountant.value,
            "must be rdp for the Skellam mechanism (its analysis is an RDP bound)",
        )
        self.check_mechanism_fields()
        if self.num_params >= 1 and self.num_clients >= 1 and noise is not None:
            self.mechanism  # noqa: B018 - once bound: validates bits now, before training

    def check_mechanism_fields(self) -> None:
        """Check (and store as floats) the mechanism's fields.

        Raises
        ------
        ConfigError
            Naming ``client.<field>``.
        """
        check(
            isinstance(self.bits, int) and 2 <= self.bits <= MAX_BITS,
            "client.bits",
            self.bits,
            f"must be an integer in [2, {MAX_BITS}]",
        )
        check(
            isinstance(self.num_params, int) and self.num_params >= 0,
            "client.num_params",
            self.num_params,
            "must be an integer >= 1",
        )
        check(isinstance(self.rotation, bool), "client.rotation", self.rotation, "must be a bool")
        rule = parse_enum(ScaleRule, "client.scale_rule", self.scale_rule)
        object.__setattr__(self, "scale_rule", rule)
        growth = parse_enum(SignalGrowth, "client.signal_growth", self.signal_growth)
        object.__setattr__(self, "signal_growth", growth)
        stddevs = check_positive("client.wrap_stddevs", self.wrap_stddevs)
        object.__setattr__(self, "wrap_stddevs", stddevs)
        beta = check_finite("client.beta", self.beta, "must be in [0, 1)")
        check(0 <= beta < 1, "client.beta", self.beta, "must be in [0, 1)")
        object.__setattr__(self, "beta", beta)
        _check_count("client.dropout_tolerance", self.dropout_tolerance, 0)
        _check_count("client.local_samples", self.local_samples, 1)
        if self.scale is not None:  # a fedpriv-account key (the run picks the scale)
            object.__setattr__(self, "scale", check_positive("scale", self.scale))

    @functools.cached_property
    def mechanism(self) -> SkellamMechanism:
        """The clients' (and decoder's) mechanism: the largest scale that cannot wrap.

        Raises
        ------
        ConfigError
            If σ, ``num_clients`` or ``num_params`` is not set, or no scale fits in ``bits``.
        """
        sigma, _ = self.sigma, self.noise_shares  # both set (bound), or refused here
        check(
            self.num_params >= 1,
            "client.num_params",
            self.num_params,
            "must be set (the model dimension; call for_run)",
        )
        draws = self.steps * self.local_samples
        summands, tail = summands_bound(self.scale_rule, draws, self.sample_rate, self.num_clients)
        fields: dict[str, Any] = dict(
            bits=self.bits,
            clipping_norm=self.max_grad_norm,
            num_clients=self.num_clients,
            dim=self.num_params,
            rotation=self.rotation,
            honest_but_curious=self.honest_but_curious,
            dropout_tolerance=self.dropout_tolerance,
            beta=self.beta,
            steps=self.steps,
            max_summands=summands,
            summand_tail=tail,
            scale_rule=self.scale_rule,
            wrap_stddevs=self.wrap_stddevs,
            signal_growth=self.signal_growth,
        )
        if self.scale is not None:
            mu = (self.scale * sigma * self.max_grad_norm) ** 2 / 2.0
            return SkellamMechanism(scale=self.scale, mu=mu, **fields)
        return SkellamMechanism.from_noise_multiplier(sigma, **fields)

    # ---- events -----------------------------------------------------------------------
    def step_event(self) -> SkellamEvent:
        """The Skellam release of one step's sum over the clients (integer units)."""
        m = self.mechanism
        return SkellamEvent(
            mu=m.mu,
            l1_sensitivity=m.l1_sensitivity,
            l2_sensitivity=m.l2_sensitivity,
            sample_rate=self.sample_rate,
        )

    def round_events(self) -> EventRuns:
        """One round: ``steps`` subsampled Skellam releases with the total μ."""
        return [(self.step_event(), self.steps)]

    def degraded_round_events(self, contributors: int) -> EventRuns:
        """A round whose sum holds only ``contributors`` clients' shares: μ_eff = min(μ,
        (contributors − [hbc]) μ/m).

        Raises
        ------
        UnaccountableRound
            If no trusted share is left in the sum.
        """
        m = self.mechanism
        mu = min(m.mu, m.mu_per_client * (contributors - int(self.honest_but_curious)))
        if mu <= 0:
            raise UnaccountableRound(
                f"contributors={contributors} leave no trusted noise in the sum"
            )
        return [(dataclasses.replace(self.step_event(), mu=mu), self.steps)]

    def local_events(self) -> EventRuns:
        """One client's own release: its share μ/m per step."""
        own = dataclasses.replace(self.step_event(), mu=self.mechanism.mu_per_client)
        return [(own, self.steps)]

    def local_epsilon(self, num_rounds: int) -> float:
        """One client's own ε (its noise share alone) after ``num_rounds`` rounds."""
        return self.accounting.epsilon_after(self.local_events(), num_rounds)

    def calibrated(self, target_epsilon: float, num_rounds: int) -> SkellamSpec:
        """The spec with the smallest σ (to 0.1 %) whose :meth:`epsilon` is <= the target
        (bisection on the run's own accountant and conversion; the scale follows σ).

        Raises
        ------
        ConfigError
            For a bad target, or one that no σ <= 1e6 reaches.
        """
        check(
            isinstance(num_rounds, int) and num_rounds >= 1,
            "num_rounds",
            num_rounds,
            "must be an integer >= 1",
        )
        target = check_positive("privacy.target_epsilon", target_epsilon, "must be > 0")

        def eps_of(sigma: float) -> float:
            return self.with_noise(sigma).epsilon(num_rounds)

        sigma = bisect_noise(eps_of, target, field="privacy.noise_multiplier")
        return self.with_noise(sigma, target)

    def extra_summary(self) -> dict[str, Any]:
        """The mechanism's parameters once it is bound (``scale`` the one in use): with the
        fields they are the keys of ``fedpriv-account skellam`` that recompute ε."""
        out: dict[str, Any] = {"mechanism": "skellam"}
        if self.noise_multiplier is None or self.num_params < 1 or self.num_clients < 1:
            return out
        m = self.mechanism
        out.update(
            scale=m.scale,
            mu=m.mu,
            l1_sensitivity=m.l1_sensitivity,
            l2_sensitivity=m.l2_sensitivity,
            wrap_bound=m.wrap_bound,
            coordinates=m.padded_dim,
        )
        return out

    def lower_bound(self, num_rounds: int) -> LowerBound:
        """Not available (:data:`NO_LOWER_BOUND`).

        The RDP bound (Agarwal, Kairouz, Liu arXiv:2110.04995, Theorem 3.5 / Corollary 3.6,
        with Steinke's subsampling, arXiv:2210.00597) uses sensitivities Δ1, Δ2 that bound
        EVERY conditionally rounded, rotated vector; a record realises a random rounded
        vector, rotated by a per-round random sign pattern, and the release is the sum modulo
        ``2**bits``. A valid lower bound needs the pmf of a statistic of that release for a
        realised pair. The record ``c e_1`` with ``s c / sqrt(n)`` an integer is realised
        exactly (its rotated, scaled coordinates are all ``±f``, no rounding), but the
        statistics whose pmfs are computable lose the signal: the projection on the rotated
        record has noise ``sqrt(n)`` times a coordinate's, far beyond ``2**bits`` under the
        probabilistic rule (it folds to nearly uniform), and one coordinate carries
        ``1/sqrt(n)`` of the signal; the whole vector under Poisson sampling is a mixture of
        products, not a composition. A Gaussian of the same variance is not a lower bound
        either (the Skellam pmf differs from the Gaussian's in the tails that decide δ).
        """
        return LowerBound.not_available(NO_LOWER_BOUND)


def no_wrap_cost(spec: SkellamSpec, num_rounds: int) -> dict[str, Any]:
    """What ``scale_rule=no_wrap`` costs: ε and scale of the same spec under the probabilistic
    rule (with rotation), or ``{}`` for another rule or an explicit scale."""
    if spec.scale_rule is not ScaleRule.NO_WRAP or spec.scale is not None:
        return {}
    other = dataclasses.replace(spec, scale_rule=ScaleRule.PROBABILISTIC, rotation=True)
    return {
        "probabilistic_epsilon": other.epsilon(num_rounds),
        "probabilistic_scale": other.mechanism.scale,
    }
