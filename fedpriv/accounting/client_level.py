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
  (and the centred count by 1), so the event's Gaussian has multiplier z / 2
  (dp-accounting ``SampledWithoutReplacementDpEvent``, RDP accountant only).
* ``random_allocation`` (each client in ``rounds_per_client`` k of each ``allocation_window``
  t rounds, chosen uniformly by the client): the tight PLD of Feldman and Shenfeld
  (:mod:`fedpriv.accounting.allocation`), one event per epoch, PLD accountant only.

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
from dataclasses import dataclass, field
from typing import Any

from dp_accounting import dp_event

from fedpriv.accounting.allocation import RandomAllocationEvent
from fedpriv.accounting.discrete_gaussian import DiscreteGaussianEvent
from fedpriv.accounting.params import Params, noise_or_target
from fedpriv.accounting.vocabulary import Accountant, Conversion, NeighboringRelation
from fedpriv.accounting.accountant import AccountingSpec
from fedpriv.common.validate import check_finite, check_positive
from fedpriv.common.errors import check
from fedpriv.mechanisms.client_sampling import ClientSampling, CohortSampler
from fedpriv.mechanisms.lattice_gaussian import lattice_noise_multiplier


@dataclass(frozen=True, kw_only=True)
class ClientLevelSpec:
    """The mechanism and participation of a client-level DP-FedAvg run.

    Parameters
    ----------
    noise_multiplier : float
        z >= 0: noise std of each round's release per unit of a client's sensitivity (the
        effective multiplier when ``count_noise_multiplier`` is set). 0: NON-PRIVATE.
    clipping_norm : float
        C > 0, the L2 bound of each client's whole model delta (the initial one with adaptive
        clipping; the sensitivity relative to C does not change as C adapts).
    cohort : CohortSampler
        Who takes part in each round (all, poisson, fixed_size, random_allocation).
    count_noise_multiplier : float, optional
        σ_b of the noisy unclipped count (adaptive clipping); ``2 σ_b > z`` is required.
    accounting : AccountingSpec
        Accountant, conversion, δ; its relation is replaced by the participation's.
    discrete : bool
        The trusted aggregator draws lattice discrete Gaussian noise (``privacy.secure_mode``,
        :mod:`fedpriv.mechanisms.lattice_gaussian`): events :class:`DiscreteGaussianEvent` with the
        rounding-inflated sensitivity; RDP accountant, client_sampling all or poisson.

    Raises
    ------
    ConfigError
        For C <= 0 or non-finite, z < 0, σ_b <= z/2, or an accountant that cannot account the
        participation (fixed_size needs rdp, random_allocation needs pld).
    """

    noise_multiplier: float
    clipping_norm: float
    cohort: CohortSampler
    count_noise_multiplier: float | None = None
    accounting: AccountingSpec = field(default_factory=AccountingSpec)
    discrete: bool = False

    def __post_init__(self) -> None:
        z = check_finite("privacy.noise_multiplier", self.noise_multiplier, "must be >= 0")
        check(z >= 0, "privacy.noise_multiplier", self.noise_multiplier, "must be >= 0")
        check_positive("privacy.clipping_norm", self.clipping_norm)
        sb = self.count_noise_multiplier
        if sb is not None:
            check_positive("privacy.count_noise_multiplier", sb)
            check(
                z == 0 or 2 * sb > z,
                "privacy.count_noise_multiplier",
                sb,
                f"must be > noise_multiplier/2 = {z / 2:g} (the count's noise would take all "
                "of the budget: Andrew et al. 2021, Sec. 3.1)",
            )
        relation = self.neighboring_relation
        object.__setattr__(
            self, "accounting", dataclasses.replace(self.accounting, neighboring_relation=relation)
        )
        kind, acc = self.cohort.client_sampling, self.accounting.accountant
        if self.discrete and z > 0:
            self._check_discrete()
        check(
            not (kind is ClientSampling.FIXED_SIZE and acc is Accountant.PLD and z > 0),
            "privacy.accountant",
            acc.value,
            "cannot account client_sampling=fixed_size (sampling without replacement has an "
            "RDP analysis only): use privacy.accountant=rdp (fedpriv-account: accountant=rdp)",
        )
        check(
            not (kind is ClientSampling.RANDOM_ALLOCATION and acc is Accountant.RDP and z > 0),
            "privacy.accountant",
            acc.value,
            "cannot account client_sampling=random_allocation (its analysis is a PLD): use "
            "privacy.accountant=pld (fedpriv-account: accountant=pld)",
        )

    def _check_discrete(self) -> None:
        """secure_mode's discrete Gaussian: accounted by RDP, for all or Poisson cohorts."""
        kind = self.cohort.client_sampling
        check(
            kind in (ClientSampling.ALL, ClientSampling.POISSON),
            "client_sampling",
            kind.value,
            "with privacy.secure_mode=true (discrete Gaussian noise) must be all or poisson: "
            "no analysis here covers the discrete Gaussian under fixed_size or random "
            "allocation",
        )
        check(
            self.accounting.accountant is Accountant.RDP,
            "privacy.accountant",
            self.accounting.accountant.value,
            "cannot account privacy.secure_mode=true's discrete Gaussian noise (its analysis "
            "is RDP: Canonne, Kamath, Steinke 2020, Thm 15): use privacy.accountant=rdp",
        )

    # ---- the mechanism --------------------------------------------------------------
    @property
    def neighboring_relation(self) -> NeighboringRelation:
        """replace-one for fixed-size cohorts, add/remove otherwise."""
        if self.cohort.client_sampling is ClientSampling.FIXED_SIZE:
            return NeighboringRelation.REPLACE_ONE
        return NeighboringRelation.ADD_REMOVE

    @property
    def update_noise_multiplier(self) -> float:
        """σ_Δ: the delta sum's noise per unit C (z itself without adaptive clipping)."""
        z, sb = float(self.noise_multiplier), self.count_noise_multiplier
        if sb is None or z == 0:
            return z
        return (z**-2 - (2 * sb) ** -2) ** -0.5

    # ---- events ---------------------------------------------------------------------
    def round_events(self) -> list[tuple[Any, int]]:
        """Events of one released round (for random allocation: of the round's whole epoch,
        recorded once per epoch, see :meth:`accounting_epoch`)."""
        z, c = float(self.noise_multiplier), self.cohort
        if z == 0:
            return [(dp_event.NonPrivateDpEvent(), 1)]
        kind = c.client_sampling
        if self.discrete:
            q = 1.0 if kind is ClientSampling.ALL else float(c.client_sample_rate)  # type: ignore[arg-type]
            return [(DiscreteGaussianEvent(lattice_noise_multiplier(z), q), 1)]
        if kind is ClientSampling.ALL:
            return [(dp_event.GaussianDpEvent(z), 1)]
        if kind is ClientSampling.POISSON:
            q = float(c.client_sample_rate)  # type: ignore[arg-type]
            return [(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), 1)]
        if kind is ClientSampling.FIXED_SIZE:
            inner = dp_event.GaussianDpEvent(z / 2)  # replace-one: the sum moves by up to 2C
            m = int(c.num_sampled_clients)  # type: ignore[arg-type]
            return [(dp_event.SampledWithoutReplacementDpEvent(c.num_clients, m, inner), 1)]
        t, k = int(c.allocation_window), int(c.rounds_per_client)  # type: ignore[arg-type]
        return [(RandomAllocationEvent(z, t, k), 1)]

    def accounting_epoch(self, server_round: int) -> int | None:
        """The allocation epoch of ``server_round`` (its events cover all of it); ``None`` when
        every round is its own event."""
        return self.cohort.epoch_of(server_round)

    def events_after(self, num_rounds: int) -> list[tuple[Any, int]]:
        """The events of ``num_rounds`` released rounds (whole epochs for allocation)."""
        epoch = self.accounting_epoch(num_rounds)
        count = num_rounds if epoch is None else epoch + 1
        return [(e, n * count) for e, n in self.round_events()]

    def epsilon(self, num_rounds: int) -> float:
        """ε at ``accounting.target_delta`` after ``num_rounds`` rounds."""
        if num_rounds == 0:
            return 0.0
        return self.accounting.epsilon(self.events_after(num_rounds))

    def calibrated(self, target_epsilon: float, num_rounds: int) -> ClientLevelSpec:
        """The spec with the smallest z (to 0.1 %) whose :meth:`epsilon` is <= the target,
        bisected on the same accountant and conversion as the run's ledger.

        Raises
        ------
        ConfigError
            For a non-positive target, or one that no z <= 1e6 reaches.
        """
        from fedpriv.accounting.calibrate import bisect_noise

        target = check_positive("privacy.target_epsilon", target_epsilon, "must be > 0")
        check(num_rounds >= 1, "num_rounds", num_rounds, "must be an integer >= 1")
        sb = self.count_noise_multiplier

        def eps_of(z: float) -> float:
            if sb is not None and 2 * sb <= z:
                return math.inf
            return dataclasses.replace(self, noise_multiplier=z).epsilon(num_rounds)

        top = 1e6 if sb is None else 2 * sb * (1 - 1e-9)
        hint = self._hint(target, num_rounds)
        z = bisect_noise(
            eps_of,
            target,
            field="privacy.noise_multiplier",
            highest=top,
            hint=hint,
            rtol=1e-3 if hint is None else 3e-3,  # allocation: ~5 s per PLD
        )
        return dataclasses.replace(self, noise_multiplier=z)

    def _hint(self, target: float, num_rounds: int) -> tuple[float, float] | None:
        """A bracket for random allocation (each PLD costs seconds): the σ of Poisson sampling
        at q = k/t on dp-accounting's fast PLD, widened by 25 % each way (checked by
        :func:`~fedpriv.accounting.calibrate.bisect_noise` before use)."""
        c = self.cohort
        if c.client_sampling is not ClientSampling.RANDOM_ALLOCATION:
            return None
        q = c.rounds_per_client / c.allocation_window  # type: ignore[operator]
        poisson = CohortSampler(c.num_clients, ClientSampling.POISSON, client_sample_rate=q)
        proxy = dataclasses.replace(self, cohort=poisson, count_noise_multiplier=None)
        z = proxy.calibrated(target, num_rounds).noise_multiplier
        return (z / 1.25, z * 1.25)

    def summary(self) -> dict[str, Any]:
        """The parameters for results.json's ``privacy`` block."""
        c = self.cohort
        return {
            "privacy_unit": "client",
            "noise_multiplier": float(self.noise_multiplier),
            "update_noise_multiplier": self.update_noise_multiplier,
            "count_noise_multiplier": self.count_noise_multiplier,
            "clipping_norm": float(self.clipping_norm),
            "client_sampling": c.client_sampling.value,
            "neighboring_relation": self.neighboring_relation.value,
            "client_sample_rate": c.client_sample_rate,
            "num_sampled_clients": c.num_sampled_clients,
            "allocation_window": c.allocation_window,
            "rounds_per_client": c.rounds_per_client,
        }


#: Keys of ``fedpriv-account client-level``.
KEYS = (
    "secure_mode",
    "noise_multiplier",
    "target_epsilon",
    "num_clients",
    "client_sampling",
    "client_sample_rate",
    "num_sampled_clients",
    "allocation_window",
    "rounds_per_client",
    "count_noise_multiplier",
    "num_rounds",
    "target_delta",
    "accountant",
    "conversion",
)


def spec_from_params(p: Params, noise_multiplier: float = 0.0) -> ClientLevelSpec:
    """The :class:`ClientLevelSpec` of ``fedpriv-account client-level``'s keys (z apart)."""
    kind = p.choice("client_sampling", tuple(ClientSampling), "all")  # a run's default
    cohort = CohortSampler(
        num_clients=p.int("num_clients", ge=1),
        client_sampling=ClientSampling(kind),
        client_sample_rate=p.float("client_sample_rate", None),
        num_sampled_clients=p.int("num_sampled_clients", None),
        allocation_window=p.int("allocation_window", None),
        rounds_per_client=p.int("rounds_per_client", None),
    )
    default_acc = "rdp" if cohort.client_sampling is ClientSampling.FIXED_SIZE else "pld"
    return ClientLevelSpec(
        noise_multiplier=noise_multiplier,
        clipping_norm=1.0,
        cohort=cohort,
        count_noise_multiplier=p.float("count_noise_multiplier", None, gt=0.0),
        accounting=AccountingSpec(
            accountant=Accountant(p.choice("accountant", tuple(Accountant), default_acc)),
            conversion=Conversion(p.choice("conversion", tuple(Conversion), "default")),
            target_delta=p.delta("target_delta"),
        ),
        discrete=p.bool("secure_mode", False),
    )


def run_cli(params: dict[str, str]) -> dict[str, Any]:
    """``fedpriv-account client-level``: ε (or the calibrated ``noise_multiplier`` for
    ``target_epsilon``) of client-level DP-FedAvg after ``num_rounds`` rounds, for
    ``client_sampling`` = all | poisson (``client_sample_rate``) | fixed_size
    (``num_sampled_clients``) | random_allocation (``allocation_window``,
    ``rounds_per_client``), with ``num_clients``, optional ``count_noise_multiplier``
    (adaptive clipping), ``target_delta``, ``accountant``, ``conversion``, ``secure_mode``
    (the trusted aggregator's lattice discrete Gaussian: RDP). The same
    :class:`ClientLevelSpec` a run builds, so a run's settings give the run's ε."""
    p = Params(params, "client-level", KEYS)
    spec = spec_from_params(p)
    num_rounds = p.int("num_rounds", 1, ge=1)
    spec, calibration = noise_or_target(p, spec, num_rounds)
    out: dict[str, Any] = {"analysis": "client-level", **calibration}
    summary = spec.summary()
    del summary["clipping_norm"]
    out.update(
        epsilon=spec.epsilon(num_rounds),
        delta=spec.accounting.target_delta,
        num_rounds=num_rounds,
        num_clients=spec.cohort.num_clients,
        expected_cohort_size=spec.cohort.expected_size,
        accountant=spec.accounting.accountant.value,
        conversion=spec.accounting.conversion.value,
        **summary,
    )
    return out
