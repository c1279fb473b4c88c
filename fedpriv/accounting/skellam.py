"""The Skellam family: multi-step local DP-SGD with Skellam noise on integers (SkellamSpec).

The spec picks the scale, builds the mechanism and states its events; the loss model (RDP of
the Skellam mechanism, sensitivities after rounding, :class:`SkellamEvent`) is
:mod:`fedpriv.accounting.loss_models.skellam_rdp` and Poisson subsampling of its RDP curve is
:mod:`fedpriv.accounting.samplers.poisson`.

References
----------
Agarwal, Kairouz, Liu (2021), "The Skellam Mechanism for Differentially Private Federated
Learning", NeurIPS, arXiv:2110.04995, Theorem 3.5 / Corollary 3.6 (RDP).
Steinke (2022), "Composition of Differential Privacy & Privacy Amplification by Subsampling",
arXiv:2210.00597 (RDP of Poisson subsampling, integer orders, add/remove).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

from scipy import stats

from fedpriv.accounting.core.lower_report import LowerBound
from fedpriv.accounting.core.params import CliKeys
from fedpriv.accounting.core.privacy_spec import EventRuns, PrivacySpec, UnaccountableRound
from fedpriv.accounting.core.vocabulary import Accountant
from fedpriv.accounting.dpsgd import DPSGDSpec, LocalStepsSum
from fedpriv.accounting.loss_models.skellam_rdp import SkellamEvent
from fedpriv.common.errors import check
from fedpriv.common.validate import check_finite, check_positive, parse_enum
from fedpriv.mechanisms.modular_range import DEFAULT_WRAP_STDDEVS, ScaleRule, SignalGrowth
from fedpriv.mechanisms.skellam_noise import DEFAULT_BETA, MAX_BITS, SkellamMechanism

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
