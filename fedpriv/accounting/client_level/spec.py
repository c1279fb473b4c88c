"""Client-level DP-FedAvg: the analysis of each participation scheme, and its calibration.

The privacy unit is a whole client. Every participating client clips its model delta to
``clipping_norm`` C (one L2 norm over all parameters); the sum over the round's clients gets
Gaussian noise N(0, σ² C²) (σ = ``noise_multiplier``). With adaptive clipping the round also
releases the noisy count of unclipped clients (each client adds ``b - 1/2``, ``b ∈ {0, 1}``,
noise N(0, σ_b²)); both releases together are one Gaussian mechanism whose noise multiplier is
the configured ``noise_multiplier`` z when the delta's noise is
``σ_Δ = (z⁻² − (2σ_b)⁻²)^(-1/2)`` (Andrew et al., Sec. 3.1).

Each participation scheme is accounted by the analysis that matches it:

* ``all`` (every client every round): Gaussian mechanism, multiplier z, add/remove.
* ``poisson`` (``client_sample_rate`` q): Poisson-subsampled Gaussian, add/remove
  (dp-accounting ``PoissonSampledDpEvent``).
* ``fixed_size`` (``num_sampled_clients`` m of N, without replacement): sampled without
  replacement, replace-one neighbours. Replacing one client moves the clipped sum by up to 2C
  (and the centred count by 1). PLD (default): the dominating pair of
  :mod:`fedpriv.accounting.samplers.fixed_size` (the Gaussian itself when m = N); RDP: the
  bound of Wang et al. on the Gaussian at z / 2 (dp-accounting
  ``SampledWithoutReplacementDpEvent``), looser.
* ``random_allocation`` (each client in ``rounds_per_client`` k of each ``allocation_window``
  t rounds, chosen uniformly by the client): the tight PLD of Feldman and Shenfeld
  (:mod:`fedpriv.accounting.samplers.random_allocation`), one event per epoch, PLD accountant only;
  an epoch
  not yet complete (k = 1) is charged for its released rounds.

References
----------
McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private Recurrent Language Models"
(arXiv:1710.06963), Alg. 1 (DP-FedAvg); Andrew, Thakkar, McMahan, Ramaswamy, "Differentially
Private Learning with Adaptive Clipping" (arXiv:1905.03871), Alg. 1 and Sec. 3.1; Wang, Balle,
Kasiviswanathan, "Subsampled Rényi Differential Privacy and Analytical Moments Accountant"
(arXiv:1808.00087), Thm. 9 (sampling without replacement); Mironov, Talwar, Zhang, "Rényi
Differential Privacy of the Sampled Gaussian Mechanism" (arXiv:1908.10530); Feldman, Shenfeld,
"Efficient Privacy Loss Accounting for Subsampling and Random Allocation" (arXiv:2602.17284).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

from dp_accounting import dp_event

from fedpriv.accounting.accountants.monte_carlo import MC_CONFIDENCE, allocation_epsilon_estimate
from fedpriv.accounting.core.calibrate import HIGHEST, RTOL, NoiseSearch
from fedpriv.accounting.core.lower_report import LowerBound
from fedpriv.accounting.core.params import CliKeys
from fedpriv.accounting.core.privacy_spec import (
    EventRuns,
    PrivacySpec,
    UnaccountableRound,
    calibrated_value,
)
from fedpriv.accounting.core.vocabulary import Accountant, NeighboringRelation
from fedpriv.accounting.loss_models.discrete_gaussian import DiscreteGaussianEvent
from fedpriv.accounting.samplers.fixed_size import fixed_size_gaussian_event
from fedpriv.accounting.samplers.random_allocation import RandomAllocationEvent, charged_rounds
from fedpriv.common.errors import check
from fedpriv.common.validate import check_positive
from fedpriv.mechanisms.client_sampling import ClientSampling, CohortSampler
from fedpriv.mechanisms.lattice_gaussian import lattice_noise_multiplier

#: The spec's summary entries ``fedpriv-account client-level`` prints.
CLI_SUMMARY = (
    "privacy_unit",
    "noise_multiplier",
    "update_noise_multiplier",
    "count_noise_multiplier",
    "client_sampling",
    "client_sample_rate",
    "num_sampled_clients",
    "allocation_window",
    "rounds_per_client",
    "accountant",
    "conversion",
)
#: What ``lower_bound=true`` answers (:mod:`fedpriv.accounting.core.lower_bound`).
LOWER_BOUND_METHOD = (
    "optimistic PLD of the realised pair: a client whose clipped update has norm C in every "
    "round it joins, the others 0 (all: exact; fixed_size: the replace-one pair; "
    "random_allocation: pld-accounting's lower PLD, a partial epoch's first round alone)"
)
#: ... and for random allocation with ``rounds_per_client`` k > 1.
MONTE_CARLO_METHOD = (
    "the larger of round 1's sure bound and the Monte Carlo lower bound of the k-of-t pair "
    "(empirical Bernstein, Maurer and Pontil arXiv:0907.3740), which holds with the stated "
    "confidence"
)


def _lattice(values: dict[str, Any]) -> dict[str, Any]:
    """``secure_mode``: the trusted aggregator draws lattice noise (RDP)."""
    return {"lattice_noise": bool(values["secure_mode"])}


def _cli_report(spec: Any, num_rounds: int) -> dict[str, Any]:
    """The cohort's size, the RDP fallback beside a fixed-size cohort's PLD
    (``epsilon_rdp``), and for random allocation with k > 1 the Monte Carlo ESTIMATE of ε with
    its confidence interval (:mod:`fedpriv.accounting.accountants.monte_carlo`): never the
    budget, nor used for calibration."""
    c = spec.bound_cohort
    out: dict[str, Any] = {"num_clients": c.num_clients, "expected_cohort_size": c.expected_size}
    if spec.non_private:
        return out
    if c.client_sampling is ClientSampling.FIXED_SIZE and spec.accountant is Accountant.PLD:
        rdp = dataclasses.replace(spec, accountant=Accountant.RDP)
        out["epsilon_rdp"] = rdp.epsilon(num_rounds)
    if c.client_sampling is ClientSampling.RANDOM_ALLOCATION and c.rounds_per_client > 1:
        est = allocation_epsilon_estimate(spec.events_after(num_rounds), spec.target_delta)
        if est is not None:
            out.update(
                epsilon_estimate=est.epsilon,
                epsilon_estimate_interval=[est.lower, est.upper],
                epsilon_estimate_confidence=est.confidence,
                epsilon_estimate_samples=est.samples,
            )
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClientLevelSpec(PrivacySpec):
    """The mechanism and participation of a client-level DP-FedAvg run (family
    ``client_level``): what each round releases about a whole client, and its events.

    Built by the run's client algorithm (``clients.client_level_dpfedavg.ClientLevelDPFedAvg``,
    which binds the run's cohort sampler and where the noise is drawn) and by
    ``fedpriv-account client-level`` (``spec_from_params``), so the CLI answers exactly what a
    run accounts.

    Parameters
    ----------
    noise_multiplier : float or None
        z >= 0: noise std of each round's release per unit of a client's sensitivity C (the
        effective multiplier of both releases when ``count_noise_multiplier`` is set). 0:
        NON-PRIVATE. ``None`` with ``target_epsilon`` (calibrated by the run).
    clipping_norm : float
        C > 0, the L2 bound of each client's WHOLE model delta (one norm over all
        parameters; real units). With adaptive clipping it is round 1's clip norm: the clip
        then moves from round to round, but every round's sensitivity relative to its own C,
        hence the events, stays the same.
    count_noise_multiplier : float, optional
        σ_b of the noisy count of unclipped clients (adaptive clipping, Andrew et al.); the
        delta's noise is then σ_Δ = (z⁻² − (2σ_b)⁻²)^(-1/2) per unit C, so ``2 σ_b > z`` is
        required.
    cohort : CohortSampler, optional
        Who takes part in each round (all, poisson, fixed_size, random_allocation); bound by
        the client algorithm from the run (needed for the events).
    noise_shares : int, optional
        m: the clients whose noise shares N(0, (σ_Δ C)²/m) make up the sum's noise (each client
        draws its share: ``client.noise_placement=clients``); ``None`` (default): the trusted
        aggregator draws the whole noise once per round. Bound by the client algorithm.
    lattice_noise : bool
        The trusted aggregator's noise is a lattice discrete Gaussian (``secure_mode``,
        :mod:`fedpriv.mechanisms.lattice_gaussian`): events :class:`DiscreteGaussianEvent`
        with the rounding-inflated sensitivity; RDP accountant, client_sampling all or poisson.
        Bound by the client algorithm.
    (and the fields of :class:`~fedpriv.accounting.core.privacy_spec.PrivacySpec`)

    Raises
    ------
    ConfigError
        For C <= 0 or non-finite, z < 0, σ_b <= z/2, both or neither of ``noise_multiplier``
        and ``target_epsilon``, an accountant that cannot account the participation
        (random_allocation needs pld), lattice noise without
        ``secure_mode`` or with client shares.

    References
    ----------
    McMahan et al. 2018, arXiv:1710.06963, Alg. 1; Andrew et al. 2021, arXiv:1905.03871,
    Sec. 3.1; Canonne, Kamath, Steinke 2020, arXiv:2004.00010, Thm 15 (discrete Gaussian).
    """

    family: ClassVar[str] = "client_level"
    bound_fields: ClassVar[tuple[str, ...]] = (
        *PrivacySpec.bound_fields,
        "cohort",
        "noise_shares",
        "lattice_noise",
    )
    cli: ClassVar[CliKeys] = CliKeys(
        doc="client-level DP-FedAvg: epsilon after num_rounds rounds for the cohort "
        "sampling (all, poisson, fixed_size, random_allocation; the run's ClientLevelSpec)",
        takes=("cohort", "secure_mode"),
        hide=("seed",),
        derive=_lattice,
        summary=CLI_SUMMARY,
        report=_cli_report,
    )

    noise_multiplier: float | None = 1.0
    clipping_norm: float = 1.0
    count_noise_multiplier: float | None = None
    cohort: CohortSampler | None = None
    noise_shares: int | None = None
    lattice_noise: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        set_ = object.__setattr__
        z = self.noise_or_target(self.noise_multiplier)
        set_(self, "noise_multiplier", z)
        set_(self, "clipping_norm", check_positive("privacy.clipping_norm", self.clipping_norm))
        sb = self.count_noise_multiplier
        if sb is not None:
            sb = check_positive("privacy.count_noise_multiplier", sb)
            set_(self, "count_noise_multiplier", sb)
            check(
                z is None or z == 0 or 2 * sb > z,
                "privacy.count_noise_multiplier",
                sb,
                f"must be > noise_multiplier/2 = {(z or 0) / 2:g} (the count's noise would take "
                "all of the budget: Andrew et al. 2021, Sec. 3.1)",
            )
        self._check_shares()
        if self.cohort is not None and z != 0:
            self._check_participation()

    def _check_shares(self) -> None:
        m = self.noise_shares
        check(
            m is None or (isinstance(m, int) and not isinstance(m, bool) and m >= 1),
            "num_clients",
            m,
            "must be an integer >= 1 (the clients whose noise shares add up)",
        )
        check(
            isinstance(self.lattice_noise, bool),
            "privacy.lattice_noise",
            self.lattice_noise,
            "must be true or false",
        )
        check(
            not self.lattice_noise or (self.secure_mode and m is None),
            "privacy.lattice_noise",
            self.lattice_noise,
            "needs privacy.secure_mode=true and the trusted aggregator's noise (no shares)",
        )

    def _check_participation(self) -> None:
        """The accountant can account the cohort sampling (and the lattice noise)."""
        kind, acc = self.bound_cohort.client_sampling, self.accountant
        if self.lattice_noise:
            self._check_discrete()
        check(
            not (kind is ClientSampling.RANDOM_ALLOCATION and acc is Accountant.RDP),
            "privacy.accountant",
            acc.value,
            "cannot account client_sampling=random_allocation (its analysis is a PLD): use "
            "privacy.accountant=pld (fedpriv-account: accountant=pld)",
        )

    def _check_discrete(self) -> None:
        """secure_mode's discrete Gaussian: accounted by RDP, for all or Poisson cohorts."""
        kind = self.bound_cohort.client_sampling
        check(
            kind in (ClientSampling.ALL, ClientSampling.POISSON),
            "client_sampling",
            kind.value,
            "with privacy.secure_mode=true (discrete Gaussian noise) must be all or poisson: "
            "no analysis here covers the discrete Gaussian under fixed_size or random "
            "allocation",
        )
        check(
            self.accountant is Accountant.RDP,
            "privacy.accountant",
            self.accountant.value,
            "cannot account privacy.secure_mode=true's discrete Gaussian noise (its analysis "
            "is RDP: Canonne, Kamath, Steinke 2020, Thm 15): use privacy.accountant=rdp",
        )

    # ---- the mechanism --------------------------------------------------------------
    @property
    def bound_cohort(self) -> CohortSampler:
        """The cohort sampler; refuses an unbound spec.

        Raises
        ------
        ConfigError
            Before the client algorithm bound the run's cohort (``for_run(plan)``).
        """
        check(
            self.cohort is not None,
            "privacy.cohort",
            None,
            "is unbound: the client algorithm binds the run's cohort (for_run(plan))",
        )
        return self.cohort  # type: ignore[return-value]

    @property
    def sigma(self) -> float:
        """``noise_multiplier`` as a number (refused before calibration)."""
        return calibrated_value("noise_multiplier", self.noise_multiplier)

    @property
    def non_private(self) -> bool:
        return self.noise_multiplier == 0

    @property
    def neighboring_relation(self) -> NeighboringRelation:
        """replace-one for fixed-size cohorts, add/remove otherwise (and while unbound)."""
        c = self.cohort
        if c is not None and c.client_sampling is ClientSampling.FIXED_SIZE:
            return NeighboringRelation.REPLACE_ONE
        return NeighboringRelation.ADD_REMOVE

    @property
    def update_noise_multiplier(self) -> float:
        """σ_Δ: the delta sum's noise per unit C (z itself without adaptive clipping)."""
        z, sb = self.sigma, self.count_noise_multiplier
        if sb is None or z == 0:
            return z
        return float((z**-2 - (2 * sb) ** -2) ** -0.5)

    # ---- events ---------------------------------------------------------------------
    def round_events(self) -> EventRuns:
        """Events of one released round (for random allocation: of the round's whole epoch,
        recorded once per epoch, see :meth:`accounting_epoch`)."""
        z, c = self.sigma, self.bound_cohort
        if z == 0:
            return [(dp_event.NonPrivateDpEvent(), 1)]
        kind = c.client_sampling
        if self.lattice_noise:
            q = 1.0 if kind is ClientSampling.ALL else float(c.client_sample_rate)  # type: ignore[arg-type]
            return [(DiscreteGaussianEvent(lattice_noise_multiplier(z), q), 1)]
        if kind is ClientSampling.ALL:
            return [(dp_event.GaussianDpEvent(z), 1)]
        if kind is ClientSampling.POISSON:
            q = float(c.client_sample_rate)  # type: ignore[arg-type]
            return [(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), 1)]
        if kind is ClientSampling.FIXED_SIZE:
            return [(self._fixed_size_event(z, c), 1)]
        t, k = int(c.allocation_window), int(c.rounds_per_client)  # type: ignore[arg-type]
        return [(RandomAllocationEvent(z, t, k), 1)]

    def _fixed_size_event(self, z: float, c: CohortSampler) -> Any:
        """m of N without replacement, replace-one (a replaced client moves the sum by up to
        2C): the Gaussian itself when m = N (exact), else the dominating pair's PLD
        (:mod:`fedpriv.accounting.samplers.fixed_size`) or, with ``accountant=rdp``,
        dp-accounting's RDP bound (Wang, Balle, Kasiviswanathan, Thm. 9) at z/2."""
        m, n = int(c.num_sampled_clients), c.num_clients  # type: ignore[arg-type]
        return fixed_size_gaussian_event(z, m, n, self.accountant)

    def degraded_round_events(self, contributors: int) -> EventRuns:
        """The trusted aggregator's noise: the full events (its noise does not depend on who
        replied). Client shares: ``contributors`` of the m shares reached the sum, multiplier
        z·√(min(contributors, m)/m).

        Raises
        ------
        UnaccountableRound
            With client shares and no contributor (no noise in the sum).
        """
        m = self.noise_shares
        if m is None:
            return self.round_events()
        if contributors < 1:
            raise UnaccountableRound(f"contributors={contributors}: no noise share in the sum")
        z = self.sigma * math.sqrt(min(contributors, m) / m)
        if z == 0:
            return self.round_events()
        return self.with_noise(z).round_events()

    def accounting_epoch(self, server_round: int) -> int | None:
        """The allocation epoch of ``server_round`` (its events cover all of it); ``None`` when
        every round is its own event."""
        return self.bound_cohort.epoch_of(server_round)

    def partial_epoch_events(self, server_round: int) -> EventRuns | None:
        """Random allocation with k = 1 and ``server_round`` inside its epoch: the epoch's
        first rounds released, charged as
        :func:`~fedpriv.accounting.samplers.random_allocation.charged_rounds`
        of them (:class:`RandomAllocationEvent` ``released_rounds``); ``None`` otherwise."""
        epoch = self.accounting_epoch(server_round)
        events = self.round_events()
        event = events[0][0]
        if epoch is None or len(events) != 1 or not isinstance(event, RandomAllocationEvent):
            return None
        released = server_round - epoch * event.num_steps
        if event.num_selected != 1 or released >= event.num_steps:
            return None
        return [
            (
                dataclasses.replace(
                    event, released_rounds=charged_rounds(released, event.num_steps)
                ),
                1,
            )
        ]

    def events_after(self, num_rounds: int) -> EventRuns:
        """The events of ``num_rounds`` released rounds (allocation: whole epochs, and the last
        one's released rounds, see :meth:`partial_epoch_events`)."""
        epoch = self.accounting_epoch(num_rounds)
        if epoch is None:
            return [(e, n * num_rounds) for e, n in self.round_events()]
        partial = self.partial_epoch_events(num_rounds)
        whole = epoch + (partial is None)
        runs = [(e, n * whole) for e, n in self.round_events()] if whole else []
        return runs + (partial or [])

    def epsilon(self, num_rounds: int) -> float:
        """ε at ``target_delta`` after ``num_rounds`` rounds (:meth:`events_after`)."""
        if num_rounds == 0:
            return 0.0
        return self.accounting.epsilon(self.events_after(num_rounds))

    def noise_search(self, target_epsilon: float, num_rounds: int) -> NoiseSearch:
        """z below 2 σ_b (adaptive clipping's count noise leaves σ_Δ > 0); for random
        allocation (seconds per PLD) a bracket from Poisson sampling (:meth:`_hint`) and a
        0.3 % tolerance."""
        sb = self.count_noise_multiplier
        hint = self._hint(target_epsilon, num_rounds)
        return NoiseSearch(
            highest=HIGHEST if sb is None else 2 * sb * (1 - 1e-9),
            hint=hint,
            rtol=RTOL if hint is None else 3e-3,
        )

    def _hint(self, target: float, num_rounds: int) -> tuple[float, float] | None:
        """A bracket for random allocation (each PLD costs seconds): the z of Poisson sampling
        at q = k/t on dp-accounting's fast PLD, widened by 25 % each way (checked by
        :func:`~fedpriv.accounting.core.calibrate.bisect_noise` before use); ``None`` for
        other samplings."""
        c = self.bound_cohort
        if c.client_sampling is not ClientSampling.RANDOM_ALLOCATION:
            return None
        q = c.rounds_per_client / c.allocation_window  # type: ignore[operator]
        poisson = CohortSampler(c.num_clients, ClientSampling.POISSON, client_sample_rate=q)
        proxy = dataclasses.replace(self, cohort=poisson, count_noise_multiplier=None)
        z = proxy.calibrated(target, num_rounds).sigma
        return (z / 1.25, z * 1.25)

    def lower_bound(self, num_rounds: int) -> LowerBound:
        """:data:`LOWER_BOUND_METHOD` after ``num_rounds`` rounds at ``target_delta``
        (:func:`~fedpriv.accounting.core.lower_bound.epsilon_lower_bound` of
        :meth:`events_after`); random allocation with k > 1: :data:`MONTE_CARLO_METHOD`."""
        if self.non_private:
            return LowerBound(math.inf, "exact: noise_multiplier=0 releases without noise")
        if self.lattice_noise:
            return LowerBound.not_available(
                "no realised pair of the lattice discrete Gaussian (secure_mode) is computed"
            )
        bound = LowerBound.of_events(
            self.events_after(num_rounds), self.target_delta, LOWER_BOUND_METHOD
        )
        c = self.bound_cohort
        if bound.value is None or c.client_sampling is not ClientSampling.RANDOM_ALLOCATION:
            return bound
        if c.rounds_per_client == 1:
            return bound
        return LowerBound(bound.value, MONTE_CARLO_METHOD, confidence=MC_CONFIDENCE)

    def extra_summary(self) -> dict[str, Any]:
        """The privacy unit, the mechanism, σ_Δ, the neighbouring relation and the cohort
        sampling's parameters (flat, as ``fedpriv-account client-level`` takes them)."""
        out: dict[str, Any] = {
            "privacy_unit": "client",
            "mechanism": "discrete_gaussian" if self.lattice_noise else "gaussian",
            "neighboring_relation": self.neighboring_relation.value,
        }
        if self.noise_multiplier is not None:
            out["update_noise_multiplier"] = self.update_noise_multiplier
        c = self.cohort
        if c is not None:
            out.update(
                client_sampling=c.client_sampling.value,
                client_sample_rate=c.client_sample_rate,
                num_sampled_clients=c.num_sampled_clients,
                allocation_window=c.allocation_window,
                rounds_per_client=c.rounds_per_client,
            )
        return out
