"""Poisson-subsampled Gaussian mechanism (DP-SGD): the event and its ε.

One DP-SGD step with Poisson sampling at rate ``q``, per-sample clipping to ``C`` and noise
``N(0, (σC)²)`` on the sum is the event ``PoissonSampledDpEvent(q, GaussianDpEvent(σ))`` of
dp-accounting (add/remove relation). It is accounted by dp-accounting's PLD accountant
(default) or RDP accountant; see :class:`fedpriv.accounting.core.ledger.PrivacyLedger` for the
conversions.

References
----------
Abadi et al. 2016 (DP-SGD); Mironov, Talwar, Zhang 2019 (RDP of the sampled Gaussian);
Doroshenko et al. 2022 (connect-the-dots PLD); Mironov 2017, Prop. 3 (RDP conversion).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

from dp_accounting import dp_event

from fedpriv.accounting.core.calibrate import COARSE_SEARCH, NoiseSearch
from fedpriv.accounting.core.ledger import PrivacyLedger
from fedpriv.accounting.core.lower_report import LowerBound
from fedpriv.accounting.core.params import CliKeys, Key
from fedpriv.accounting.core.privacy_spec import (
    EventRuns,
    PrivacySpec,
    UnaccountableRound,
    calibrated_value,
)
from fedpriv.accounting.core.vocabulary import Accountant, Conversion
from fedpriv.common.errors import check
from fedpriv.common.validate import check_finite, check_positive, parse_enum

SAMPLING_REFUSAL = (
    "is not covered: the Poisson analysis under-reports epsilon for shuffled or fixed-size "
    "batches; use sampling=poisson or the batch-clipping analysis"
)
#: ``fedpriv-account poisson-gaussian``'s ``sampling`` (only Poisson batches are covered).
SAMPLING_KEY = Key(
    name="sampling",
    kind=str,
    default="poisson",
    choices=("poisson",),
    refusal=SAMPLING_REFUSAL,
    doc="how batches are drawn: only poisson is covered by this analysis",
)
#: What ``lower_bound=true`` answers for a :class:`DPSGDSpec`
#: (:class:`~fedpriv.accounting.secagg.lower.LocalStepsGaussianRound`): the optimistic PLD
#: (Doroshenko et al. arXiv:2207.04380) of the realised add/remove pair of one round, a record
#: whose clipped gradient is the constant ``C e_1`` and the others 0, the round releasing its
#: ``steps`` noisy sums summed (one step: the Poisson-subsampled Gaussian itself).
LOWER_BOUND_METHOD = (
    "optimistic PLD of the realised pair: a record with a constant gradient of norm C, the "
    "others 0, each round releasing its S local steps summed"
)


def poisson_gaussian_event(
    noise_multiplier: float, sample_rate: float, *, sampling: str = "poisson"
) -> dp_event.DpEvent:
    """The dp-accounting event of one Poisson-subsampled Gaussian step.

    Parameters
    ----------
    noise_multiplier : float
        σ: noise std divided by the clipping norm (sensitivity); ``>= 0`` (0 = no privacy).
    sample_rate : float
        q: probability that each record is in the batch, in ``[0, 1]``.
    sampling : str
        How batches are drawn; only ``"poisson"`` is covered by this analysis.

    Returns
    -------
    DpEvent
        ``GaussianDpEvent(σ)`` when ``q == 1``, else
        ``PoissonSampledDpEvent(q, GaussianDpEvent(σ))``.

    Raises
    ------
    ConfigError
        If σ is negative or not finite, q is outside [0, 1], or ``sampling`` is not
        ``"poisson"`` (shuffled or fixed-size batches accounted as Poisson under-report ε;
        use the batch-clipping analysis for those).
    """
    check(sampling == "poisson", "sampling", sampling, SAMPLING_REFUSAL)
    check(
        isinstance(noise_multiplier, (int, float))
        and math.isfinite(noise_multiplier)
        and noise_multiplier >= 0,
        "noise_multiplier",
        noise_multiplier,
        "must be a finite number >= 0",
    )
    check(
        isinstance(sample_rate, (int, float)) and 0 <= sample_rate <= 1,
        "sample_rate",
        sample_rate,
        "must be in [0, 1]",
    )
    gaussian = dp_event.GaussianDpEvent(float(noise_multiplier))
    if sample_rate == 1:
        return gaussian
    return dp_event.PoissonSampledDpEvent(float(sample_rate), gaussian)


def poisson_gaussian_epsilon(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    target_delta: float,
    accountant: str = "pld",
    conversion: str = "default",
) -> float:
    """ε of ``steps`` composed Poisson-subsampled Gaussian steps at ``target_delta``.

    Raises
    ------
    ConfigError
        For out-of-range arguments (see :func:`poisson_gaussian_event` and the ledger).
    """
    check(isinstance(steps, int) and steps >= 0, "steps", steps, "must be an integer >= 0")
    ledger = PrivacyLedger(accountant=accountant, conversion=conversion)
    if steps > 0:
        ledger.record(poisson_gaussian_event(noise_multiplier, sample_rate), steps)
    else:
        poisson_gaussian_event(noise_multiplier, sample_rate)  # validate anyway
    return ledger.get_epsilon(target_delta)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LocalStepsSum:
    """The fields and checks of multi-step local DP-SGD whose SUM over the clients is released,
    shared by its Gaussian (:class:`DPSGDSpec`) and Skellam
    (:class:`~fedpriv.accounting.skellam.SkellamSpec`) specs.

    Every client runs ``steps`` local steps per round; each step draws a Poisson batch of the
    client's records at ``sample_rate`` q, clips every per-sample gradient to ``max_grad_norm``
    C, sums, adds its share of noise of std σC over the sum and divides by the PUBLIC
    ``normalizer`` B. A mixin of the specs (not a spec itself): each spec checks its noise
    parameter with :meth:`PrivacySpec.noise_or_target`, then calls :meth:`check_local_steps`.

    Parameters
    ----------
    noise_multiplier : float or None
        σ >= 0: std of the noise of the released SUM per step, per unit clipping norm;
        ``None`` with ``target_epsilon`` (calibrated by the run).
    sample_rate : float
        q in [0, 1]: each record's probability to be in a step's batch.
    max_grad_norm : float
        C > 0, the per-sample clipping norm (real units).
    honest_but_curious : bool
        Size each share so that N − 1 clients' noise suffices (a client may subtract its own).
    steps : int
        Local steps per round (S), >= 1 (bound by the client algorithm).
    num_clients : int
        N >= 1, the clients whose noise adds up in the released sum (bound: the nominal
        cohort); 0 = not bound yet (what needs it, e.g. the noise shares, refuses it).
    normalizer : float or None
        B > 0, the public constant dividing every client's noisy gradient sum (e.g. the
        nominal expected batch ``q * num_train_records / N``); ``None`` when not bound yet
        (it does not change ε, only the scale of the release).
    """

    noise_multiplier: float | None = 1.2
    sample_rate: float = 0.1
    max_grad_norm: float = 1.0
    honest_but_curious: bool = False
    steps: int = 1
    num_clients: int = 0
    normalizer: float | None = None

    def check_local_steps(self) -> None:
        """Check (and store as floats) every field but the noise parameter.

        Raises
        ------
        ConfigError
            Naming ``privacy.<field>``, ``client.steps``, ``client.normalizer`` or
            ``num_clients``.
        """
        set_ = object.__setattr__
        q_range = "must be a finite number in [0, 1]"
        q = check_finite("privacy.sample_rate", self.sample_rate, q_range)
        check(0 <= q <= 1, "privacy.sample_rate", self.sample_rate, q_range)
        set_(self, "sample_rate", q)
        set_(self, "max_grad_norm", check_positive("privacy.max_grad_norm", self.max_grad_norm))
        check(
            isinstance(self.steps, int) and not isinstance(self.steps, bool) and self.steps >= 1,
            "client.steps",
            self.steps,
            "must be an integer >= 1",
        )
        check(
            isinstance(self.num_clients, int)
            and not isinstance(self.num_clients, bool)
            and self.num_clients >= 0,
            "num_clients",
            self.num_clients,
            "must be an integer >= 1 (0: not bound yet)",
        )
        check(
            isinstance(self.honest_but_curious, bool),
            "privacy.honest_but_curious",
            self.honest_but_curious,
            "must be true or false",
        )
        if self.num_clients:  # once bound: a trusted client's noise must be in the sum
            self.noise_shares  # noqa: B018 - refuses N = 1 with honest_but_curious
        if self.normalizer is not None:
            set_(self, "normalizer", check_positive("client.normalizer", self.normalizer))

    @property
    def sigma(self) -> float:
        """``noise_multiplier`` as a number (refused before calibration)."""
        return calibrated_value("noise_multiplier", self.noise_multiplier)

    @property
    def noise_shares(self) -> int:
        """m: clients whose noise the privacy of the sum relies on (N, or N − 1).

        Raises
        ------
        ConfigError
            Before ``num_clients`` is bound, or for N = 1 with ``honest_but_curious``.
        """
        check(
            self.num_clients >= 1,
            "num_clients",
            self.num_clients,
            "is not bound yet (the client algorithm binds the nominal cohort: for_run)",
        )
        shares = self.num_clients - int(self.honest_but_curious)
        check(
            shares >= 1,
            "num_clients",
            self.num_clients,
            "must be >= 2 with privacy.honest_but_curious=true",
        )
        return shares

    @property
    def client_noise_multiplier(self) -> float:
        """Each client's share of σ: σ/√m (the third paper's appendix unit, Thm 4.7)."""
        return self.sigma / math.sqrt(self.noise_shares)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DPSGDSpec(PrivacySpec, LocalStepsSum):
    """Multi-step local DP-SGD whose SUM over clients is released: validation, events, ε.

    Every client runs ``steps`` local steps per round; each step draws a Poisson batch of the
    client's records at ``sample_rate`` q, clips every per-sample gradient to ``max_grad_norm``
    C, sums, adds its share N(0, (σC)²/m) of the noise (m = :attr:`noise_shares`) and divides
    by the PUBLIC ``normalizer`` B, the same constant for every client. The aggregator releases
    only Σ_i Δ_i. Per step the released sum is ``(Σ_records clipped grads + N(0, (σC)²)) / B``
    on the union of the clients' data: one Poisson-subsampled Gaussian with noise multiplier σ
    for every record, whichever client holds it, because B is common to all clients (a
    client-dependent divisor B_i would scale a record's sensitivity by 1/B_i but the noise by
    a mixture of all 1/B_j, so records of small clients would get less than σ).

    Both the run's client algorithm (``clients.local_dpsgd.LocalDPSGD``) and ``fedpriv-account
    poisson-gaussian`` build this spec, so the CLI answers exactly what the run accounts.

    Parameters
    ----------
    noise_multiplier : float or None
        σ >= 0 (0 = no privacy), or ``None`` with ``target_epsilon``.
    (and the fields of :class:`LocalStepsSum`: sample_rate, max_grad_norm,
    honest_but_curious, steps, num_clients, normalizer; and of
    :class:`~fedpriv.accounting.core.privacy_spec.PrivacySpec`)

    Raises
    ------
    ConfigError
        For a non-finite or out-of-range field, naming ``privacy.<field>``, ``client.steps`` or
        ``num_clients``; for both or neither of ``noise_multiplier`` and ``target_epsilon``.

    References
    ----------
    Abadi et al. 2016, "Deep Learning with Differential Privacy", arXiv:1607.00133, Alg. 1;
    the third paper, On Using Secure Aggregation in Differentially Private Federated
    Learning with Multiple Local Steps (Heikkilä), Theorems 4.6 (sum-dominating mechanism) and
    4.7 (local σ/√N).
    """

    family: ClassVar[str] = "dpsgd"
    bound_fields: ClassVar[tuple[str, ...]] = (
        *PrivacySpec.bound_fields,
        "steps",
        "num_clients",
        "normalizer",
    )
    cli: ClassVar[CliKeys] = CliKeys(
        doc="DP-SGD: epsilon after num_rounds rounds of `steps` Poisson-subsampled Gaussian "
        "steps (the run's DPSGDSpec; noise_multiplier is sigma of the released sum)",
        takes=("steps",),
        hide=("max_grad_norm", "honest_but_curious"),
        extra=(SAMPLING_KEY,),
        summary=("noise_multiplier", "sample_rate", "steps", "accountant", "conversion"),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "noise_multiplier", self.noise_or_target(self.noise_multiplier))
        self.check_local_steps()

    # ---- noise shares -----------------------------------------------------------------
    @property
    def non_private(self) -> bool:
        return self.noise_multiplier == 0

    @property
    def local_noise_stddev(self) -> float:
        """Each client's noise std per step, real units before dividing by B: σ C / √m."""
        return self.client_noise_multiplier * self.max_grad_norm

    # ---- events -----------------------------------------------------------------------
    def step_event(self, noise_multiplier: float | None = None) -> dp_event.DpEvent:
        """The Poisson-subsampled Gaussian of one step's released sum."""
        sigma = self.sigma if noise_multiplier is None else noise_multiplier
        return poisson_gaussian_event(sigma, self.sample_rate)

    def round_events(self) -> EventRuns:
        """One round's release: ``steps`` Poisson-subsampled Gaussians with σ (Thm 4.6)."""
        return [(self.step_event(), self.steps)]

    def degraded_round_events(self, contributors: int) -> EventRuns:
        """A round whose sum holds only ``contributors`` clients' noise (dropouts):
        σ_eff = σ √(min(contributors − [hbc], m) / m).

        Raises
        ------
        UnaccountableRound
            If no trusted client's noise is left in the sum.
        """
        trusted = contributors - int(self.honest_but_curious)
        if trusted < 1:
            raise UnaccountableRound(
                f"contributors={contributors} leave no trusted noise in the sum"
            )
        frac = min(trusted, self.noise_shares) / self.noise_shares
        return [(self.step_event(self.sigma * math.sqrt(frac)), self.steps)]

    def local_events(self) -> EventRuns:
        """One client's own release (its LDP): σ/√m per step (Thm 4.7)."""
        return [(self.step_event(self.client_noise_multiplier), self.steps)]

    def noise_search(self, target_epsilon: float, num_rounds: int) -> NoiseSearch:
        """σ 0 when no record is ever sampled (``sample_rate=0``); for PLD, a bracket from a
        fast RDP search (checked before use)."""
        if self.sample_rate == 0:
            return NoiseSearch(exact=0.0)
        if self.accountant is not Accountant.PLD:
            return NoiseSearch()
        rdp = dataclasses.replace(self, accountant=Accountant.RDP)
        sigma = rdp.solve_noise(target_epsilon, lambda s: s.epsilon(num_rounds), COARSE_SEARCH)
        return NoiseSearch(hint=(0.75 * sigma, sigma))

    def lower_bound(self, num_rounds: int) -> LowerBound:
        """:data:`LOWER_BOUND_METHOD` after ``num_rounds`` rounds at ``target_delta`` (exact
        0 when no record is ever sampled; none without noise)."""
        from fedpriv.accounting.secagg.lower import LocalStepsGaussianRound

        if self.sample_rate == 0:
            return LowerBound(0.0, "exact: sample_rate=0 releases nothing about a record")
        if self.sigma == 0:
            return LowerBound.not_available(
                "noise_multiplier=0 releases the sum without noise (no pair is computed)"
            )
        pair = LocalStepsGaussianRound(self.sigma, self.sample_rate, self.steps)
        return LowerBound.of_events([(pair, num_rounds)], self.target_delta, LOWER_BOUND_METHOD)

    def extra_summary(self) -> dict[str, Any]:
        """The mechanism, each client's share of σ and the noise shares."""
        out: dict[str, Any] = {"mechanism": "gaussian"}
        if not self.num_clients:
            return out  # not bound yet: no shares
        out["noise_shares"] = self.noise_shares
        if self.noise_multiplier is not None:
            out["client_noise_multiplier"] = self.client_noise_multiplier
        return out


def calibrate_noise_multiplier(
    target_epsilon: float,
    target_delta: float,
    sample_rate: float,
    steps: int,
    accountant: str = "pld",
    conversion: str = "default",
) -> float:
    """Smallest DP-SGD ``noise_multiplier`` with ε ≤ ``target_epsilon`` after ``steps`` steps.

    A thin wrapper of :meth:`DPSGDSpec.calibrated` (one round of ``steps`` steps): the run,
    the CLI and this function share one calibration path, which honours both ``accountant``
    and ``conversion``.

    Returns
    -------
    float
        σ within 0.1 % of the smallest that meets the target (ε(σ) ≤ target was evaluated).
        0.0 if ``sample_rate == 0`` (no record is ever used).

    Raises
    ------
    ConfigError
        For out-of-range arguments or an unreachable target.
    """
    check(isinstance(steps, int) and steps >= 1, "steps", steps, "must be an integer >= 1")
    spec = DPSGDSpec(
        noise_multiplier=0.0,
        sample_rate=sample_rate,
        steps=steps,
        accountant=parse_enum(Accountant, "accountant", accountant),
        conversion=parse_enum(Conversion, "conversion", conversion),
        target_delta=target_delta,
    )
    return spec.calibrated(target_epsilon, 1).sigma
