"""Client-level DP-FTRL: correlated noise (a matrix factorization) with bounded participation.

The privacy unit is a whole client. Every participating client clips its model delta to
``clipping_norm`` C; the trusted aggregator adds to round t's sum the noise
``σ_t = z · C · s₁ · w_t``, where ``w = M Z`` is the factorization's streaming noise
(:mod:`fedpriv.mechanisms.correlated_noise`; ``M = C_mf⁻¹`` for a square strategy matrix),
``s₁`` the sensitivity of ONE participation (the strategy's largest column norm) and
z = ``noise_multiplier``, the noise std per unit of one participation's sensitivity (the
same meaning as in DP-FedAvg: with the identity factorization the noise is DP-FedAvg's).
The server enforces the participation pattern (:mod:`fedpriv.mechanisms.enforced_cohort`).

Accounting (two analyses, each for the pattern the server enforces):

* unamplified (``participation`` single or min_separation, any factorization): the released
  rounds 1..t are a Gaussian mechanism with sensitivity ``s_t`` (the pattern's sensitivity of
  the first t rows of the strategy matrix, non-decreasing in t) and noise ``z s₁`` per unit
  C, i.e. μ_t = s_t / (z s₁)-GDP. Each released round charges the increment
  ``μ_t² − μ_prev²`` as a Gaussian event (Gaussian mechanisms compose exactly in μ², so the
  ledger's composition is μ_t-GDP: the PREFIX BOUND). ``s_t`` is evaluated exactly where it
  can change for banded strategies (rounds 1 + jb) and otherwise on a grid of checkpoints,
  each round charged up to the next checkpoint (an upper bound, never below).
* amplified BandMF (``participation=cyclic_poisson``, b groups, each round samples its group
  with rate q; banded strategy with at most b bands, or the identity; any other strategy
  under cyclic Poisson is accounted unamplified, as at most ceil(n/b) participations b
  apart): a client takes part in at most
  ⌈n/b⌉ rounds, each a Poisson-subsampled Gaussian with multiplier z (dp-accounting
  ``PoissonSampledDpEvent``), composed; the worst group is the one of round 1, charged at
  rounds 1, b + 1, 2b + 1, ... (prefix bound).

Rounds that are not released (an empty enforced cohort) are charged at the next released round
(the increments run from the last charged round), so ε is never below the prefix's.

References
----------
Kairouz, McMahan, Song, Thakkar, Thakurta, Xu 2021, arXiv:2103.00039 (DP-FTRL, tree
aggregation); Choquette-Choo, McMahan, Rush, Thakurta 2023, arXiv:2211.06530, Sec. 2-3
(multi-epoch MF, b-min-separation sensitivity); Choquette-Choo, Ganesh, McKenna, McMahan,
Rush, Thakurta, Xu 2023, arXiv:2306.08153, Sec. 4 (amplified BandMF, cyclic Poisson);
Dong, Roth, Su 2019, arXiv:1905.02383, Cor. 2 (μ-GDP composes as √Σμ²).
"""

from __future__ import annotations

import dataclasses
import math
from functools import cached_property
from typing import Any, ClassVar

from dp_accounting import dp_event

from fedpriv.accounting.client_level.spec import ClientLevelSpec
from fedpriv.accounting.core.calibrate import NoiseSearch
from fedpriv.accounting.core.lower_report import LowerBound
from fedpriv.accounting.core.params import CliKeys, Key
from fedpriv.accounting.core.privacy_spec import EventRuns
from fedpriv.accounting.core.vocabulary import NeighboringRelation
from fedpriv.accounting.ftrl.lower import lower_bound_events
from fedpriv.common.errors import ConfigError, check
from fedpriv.common.validate import parse_enum
from fedpriv.mechanisms.client_sampling import ClientSampling, CohortSampler
from fedpriv.mechanisms.correlated_noise import Factorization
from fedpriv.mechanisms.mf_catalog import FactorizationKind, make_factorization
from fedpriv.mechanisms.participation import Participation, ParticipationKind

#: Banded strategies (the identity has one band): closed-form sensitivity, amplifiable.
BANDED_KINDS = (FactorizationKind.BANDED, FactorizationKind.IDENTITY)
#: The most rounds a strategy is built for, and the most BLT buffers (beyond: refused, one line).
MAX_ROUNDS, MAX_BUFFERS = 100_000, 16
#: Grid checkpoints of the prefix sensitivity for strategies without a closed form.
PREFIX_CHECKPOINTS = 24
#: The start-up check materialises the noise-generating matrix up to this many rounds.
MATERIALIZE_MAX_ROUNDS = 4096


#: The spec's summary entries ``fedpriv-account ftrl`` prints.
CLI_SUMMARY = (
    "privacy_unit",
    "noise_multiplier",
    "factorization",
    "effective_bands",
    "participation",
    "max_participations_in_run",
    "participation_sensitivity",
    "sensitivity",
    "effective_noise_multiplier",
    "workload_rmse",
    "noise_vectors",
    "prefix_bound",
    "accountant",
    "conversion",
)
#: What ``lower_bound=true`` answers (:mod:`fedpriv.accounting.ftrl.lower`).
LOWER_BOUND_METHOD = (
    "exact Gaussian pair of the noise the stream generates (its Gram matrix, materialised) "
    "and one client taking part in rounds o, o + b, ... with the same unit update; amplified "
    "BandMF: one group's Poisson-sampled rounds, optimistic PLDs"
)
#: ``cyclic_poisson``'s cohort: the clients and each one's rate within its round's group.
COHORT_KEYS = (
    Key(
        name="num_clients",
        kind=int,
        default=1000,
        limits={"ge": 1},
        doc="registered clients (participation=cyclic_poisson)",
    ),
    Key(
        name="client_sample_rate",
        kind=float,
        default=None,
        doc="q: each client's rate within its round's group (participation=cyclic_poisson)",
    ),
)


def _cohort(values: dict[str, Any]) -> dict[str, Any]:
    """``cyclic_poisson``: the Poisson cohort of ``num_clients`` at ``client_sample_rate``;
    other patterns take no cohort."""
    if values["participation"] is ParticipationKind.CYCLIC_POISSON:
        rate = values["client_sample_rate"]
        cohort = CohortSampler(
            values["num_clients"], ClientSampling.POISSON, client_sample_rate=rate
        )
        return {"cohort": cohort}
    check(
        values["client_sample_rate"] is None,
        "client_sample_rate",
        values["client_sample_rate"],
        "applies only to participation=cyclic_poisson",
    )
    return {"cohort": None}


@dataclasses.dataclass(frozen=True, kw_only=True)
class FTRLSpec(ClientLevelSpec):
    """The mechanism, participation and events of a client-level DP-FTRL run (family
    ``ftrl``; see the module docstring).

    Parameters
    ----------
    noise_multiplier : float or None
        z >= 0, the noise std per unit of one participation's sensitivity C · s₁ (0: none).
        ``None`` with ``target_epsilon`` (calibrated by the run).
    clipping_norm : float
        C > 0, the L2 bound of each client's whole model delta.
    factorization : {"identity", "tree_online", "tree_honaker", "banded", "blt", "dense"}
        The correlated-noise strategy: identity | tree_online | tree_honaker | banded | blt.
        Also ``dense`` (the optimal dense factorization, n <= 2,000; see
        :mod:`fedpriv.mechanisms.mf_catalog`).
    bands : int, optional
        Bands of banded (BandMF): at most min_separation b (null: b, or min(n, 32) if single).
        Columns b apart are then orthogonal.
    buffers : int
        Buffers of blt, in 1..16.
    participation : {"single", "min_separation", "cyclic_poisson"}
        The pattern the server enforces: single | min_separation | cyclic_poisson.
    max_participations : int, optional
        k >= 1, the most rounds one client takes part in (``min_separation`` only).
    min_separation : int, optional
        b in 1..num_rounds: rounds between two participations, or the cyclic_poisson groups.
        (``min_separation``: a client is excluded for b - 1 rounds after taking part.)
    cohort : CohortSampler, optional
        The run's cohort sampler (bound); ``cyclic_poisson`` needs ``client_sampling=poisson``
        (its ``client_sample_rate`` is q within the round's group).
    num_rounds : int, optional
        n, the rounds the factorization is built for (bound by the run, or the CLI's).
    (and the fields of :class:`~fedpriv.accounting.client_level.spec.ClientLevelSpec`: its
    clipping and cohort; adaptive clipping, client noise shares and lattice noise are refused)

    Raises
    ------
    ConfigError
        For a field out of range, adaptive clipping's ``count_noise_multiplier`` (its extra
        release is not accounted here), client noise shares, a strategy with more bands than
        the separation allows, amplification for a non-banded strategy, ``secure_mode`` (the
        noise stream is replayed from the seed on resume).
    """

    family: ClassVar[str] = "ftrl"
    bound_fields: ClassVar[tuple[str, ...]] = (*ClientLevelSpec.bound_fields, "num_rounds")
    prefix_accounted: ClassVar[bool] = True
    fixed_horizon: ClassVar[bool] = True
    cli: ClassVar[CliKeys] = CliKeys(
        doc="client-level DP-FTRL (correlated noise, enforced participation): epsilon after "
        "the num_rounds the factorization is built for (the run's FTRLSpec)",
        hide=("count_noise_multiplier",),
        extra=COHORT_KEYS,
        rounds=Key(name="num_rounds", kind=int, limits={"ge": 1}, doc="n: the rounds run"),
        bind_rounds=True,
        derive=_cohort,
        summary=CLI_SUMMARY,
    )

    factorization: FactorizationKind = FactorizationKind.BANDED
    bands: int | None = None
    buffers: int = 4
    participation: ParticipationKind = ParticipationKind.SINGLE
    max_participations: int | None = None
    min_separation: int | None = None
    num_rounds: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        set_ = object.__setattr__
        check(
            self.count_noise_multiplier is None,
            "privacy.count_noise_multiplier",
            self.count_noise_multiplier,
            "must be null with privacy=ftrl: adaptive clipping's noisy count is a release the "
            "DP-FTRL analysis here does not account (use fixed clipping)",
        )
        check(
            self.noise_shares is None,
            "client.noise_placement",
            "clients",
            "must be server with privacy=ftrl (the correlated noise is one stream)",
        )
        kind = parse_enum(FactorizationKind, "privacy.factorization", self.factorization)
        set_(self, "factorization", kind)
        part = parse_enum(ParticipationKind, "privacy.participation", self.participation)
        set_(self, "participation", part)
        for name, top in (("bands", None), ("num_rounds", MAX_ROUNDS), ("buffers", MAX_BUFFERS)):
            v = getattr(self, name)
            ok = v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1)
            check(ok, _key(name), v, "must be an integer >= 1")
            if top is not None and v is not None:
                check(v <= top, _key(name), v, f"must be <= {top} with privacy=ftrl")
        check(self.buffers is not None, "privacy.buffers", None, "must be an integer >= 1")
        check(
            not self.secure_mode,
            "privacy.secure_mode",
            self.secure_mode,
            "is not supported with privacy=ftrl: the correlated noise stream is replayed from "
            "the run's seed (resume, the start-up check); use privacy=client_level",
        )
        self._check_pattern()

    def _check_participation(self) -> None:
        """Any cohort sampling: the enforced pattern, not the sampling, is accounted."""

    @property
    def neighboring_relation(self) -> NeighboringRelation:
        """add/remove (zero-out) of a client's updates, for every cohort sampling."""
        return NeighboringRelation.ADD_REMOVE

    def accounting_epoch(self, server_round: int) -> int | None:
        return None

    def _check_pattern(self) -> None:
        """The pattern is valid, and an analysis covers the strategy under it."""
        pattern = self.pattern  # validates k, b (and q once bound)
        kind, b = self.factorization, pattern.separation
        n = self.num_rounds
        check(
            n is None or self.min_separation is None or self.min_separation <= n,
            "privacy.min_separation",
            self.min_separation,
            f"must be <= num_rounds={n} (b >= n: each client takes part once: use "
            "privacy.participation=single)",
        )
        check(
            n is None or self.bands is None or self.bands <= n,
            "privacy.bands",
            self.bands,
            f"must be <= num_rounds={n}",
        )
        if self.bands is not None:
            check(
                kind is FactorizationKind.BANDED,
                "privacy.bands",
                self.bands,
                "is used by privacy.factorization=banded only",
            )
        if pattern.kind is not ParticipationKind.SINGLE and kind is FactorizationKind.BANDED:
            check(
                self.bands is None or self.bands <= b,
                "privacy.bands",
                self.bands,
                f"must be <= privacy.min_separation={b} (columns b apart must be orthogonal "
                "for the banded analysis; arXiv:2211.06530 Sec. 4)",
            )

    # ---- the pattern and the strategy ---------------------------------------------------
    @property
    def pattern(self) -> Participation:
        """The participation the server enforces (q from the bound Poisson cohort)."""
        q = None
        if self.participation is ParticipationKind.CYCLIC_POISSON:
            q = 1.0  # validated against the cohort once bound
            if self.cohort is not None:
                check(
                    self.cohort.client_sampling is ClientSampling.POISSON,
                    "client_sampling",
                    self.cohort.client_sampling.value,
                    "must be poisson with privacy.participation=cyclic_poisson (q: "
                    "client_sample_rate, the rate within each round's group)",
                )
                q = float(self.cohort.client_sample_rate)  # type: ignore[arg-type]
        return Participation(
            kind=self.participation,
            max_participations=self.max_participations,
            min_separation=self.min_separation,
            client_sample_rate=q,
        )

    def enforced_participation(self) -> Participation:
        """The pattern the server enforces: the one the events are stated for."""
        return self.pattern

    @property
    def amplified(self) -> bool:
        """Amplified BandMF applies: cyclic Poisson with a banded strategy of at most b bands
        (checked); other strategies under cyclic Poisson are accounted without amplification,
        as k = ceil(n/b) participations b apart."""
        return self.pattern.amplified and self.factorization in BANDED_KINDS

    @property
    def rounds(self) -> int:
        """n (refused before the run or the CLI binds it)."""
        check(self.num_rounds is not None, "num_rounds", None, "is unbound (for_run binds it)")
        return int(self.num_rounds)  # type: ignore[arg-type]

    @property
    def effective_bands(self) -> int:
        """The bands of ``banded``: given, or b (min_separation, cyclic), or min(n, 32)."""
        if self.bands is not None:
            return self.bands
        if self.participation is ParticipationKind.SINGLE:
            return min(self.rounds, 32)
        return min(self.rounds, self.pattern.separation)

    @cached_property
    def strategy(self) -> Factorization:
        """The factorization for n rounds (optimised, cached on disk: ``mf_catalog``)."""
        return make_factorization(
            self.factorization, self.rounds, self.pattern, self.effective_bands, self.buffers
        )

    @cached_property
    def participation_sensitivity(self) -> float:
        """s₁: the sensitivity of one participation over n rounds (largest column norm)."""
        single = Participation(kind=ParticipationKind.SINGLE)
        return self.strategy.analytic_sensitivity(single, self.rounds)

    @cached_property
    def prefix_sensitivities(self) -> tuple[tuple[int, float], ...]:
        """``((t, s_t), ...)``: checkpoints t (increasing, the last n) and the sensitivity of
        the first t rows under the pattern; ``s_t`` is used for every round up to t."""
        n, pattern = self.rounds, self.pattern
        points = _checkpoints(n, pattern, self._bands)
        return tuple((t, self.strategy.analytic_sensitivity(pattern, t)) for t in points)

    @property
    def _bands(self) -> int | None:
        """The bands of a banded strategy (the identity has one); ``None`` for the others."""
        if self.factorization not in BANDED_KINDS:
            return None
        return 1 if self.factorization is FactorizationKind.IDENTITY else self.effective_bands

    def prefix_sensitivity(self, server_round: int) -> float:
        """An upper bound on ``s_t`` for t = ``server_round`` (the next checkpoint's)."""
        if server_round <= 0:
            return 0.0
        for t, s in self.prefix_sensitivities:
            if t >= server_round:
                return s
        return self.prefix_sensitivities[-1][1]

    # ---- the noise ------------------------------------------------------------------------
    @property
    def noise_stddev(self) -> float:
        """z · C · s₁: the std of the fresh draws behind each round's noise (real units)."""
        return self.sigma * self.clipping_norm * self.participation_sensitivity

    # ---- events ---------------------------------------------------------------------------
    def round_events(self) -> EventRuns:
        """The events a release of round 1 charges (the run charges :meth:`prefix_events`)."""
        return self.prefix_events(0, 1)

    def degraded_round_events(self, contributors: int) -> EventRuns:
        """The trusted aggregator's noise does not depend on who replied: the full events."""
        return self.round_events()

    def prefix_events(self, previous_round: int, server_round: int) -> EventRuns:
        """Events that releasing ``server_round`` adds when the last charged round was
        ``previous_round`` (0: none): the prefix bound of the module docstring."""
        if self.non_private:
            return [(dp_event.NonPrivateDpEvent(), 1)]
        z, b = self.sigma, self.pattern.separation
        if self.amplified:
            count = _group_rounds(server_round, b) - _group_rounds(previous_round, b)
            inner = dp_event.GaussianDpEvent(z)
            event = dp_event.PoissonSampledDpEvent(self.pattern.client_sample_rate, inner)
            return [(event, count)] if count > 0 else []
        s1 = self.participation_sensitivity
        mu2 = (
            self.prefix_sensitivity(server_round) ** 2
            - self.prefix_sensitivity(previous_round) ** 2
        ) / (z * s1) ** 2
        if mu2 <= 0:
            return []
        return [(dp_event.GaussianDpEvent(1.0 / math.sqrt(mu2)), 1)]

    def events_after(self, num_rounds: int) -> EventRuns:
        """The events of ``num_rounds`` released rounds (all charged)."""
        return self.prefix_events(0, num_rounds) if num_rounds else []

    def epsilon(self, num_rounds: int) -> float:
        """ε at ``target_delta`` after ``num_rounds`` released rounds (the prefix bound)."""
        events = self.events_after(num_rounds)
        if not events:
            return 0.0
        ledger = self.accounting.ledger()
        for event, count in events:
            ledger.record(event, count)
        return float(ledger.get_epsilon(self.target_delta))

    def calibration_spec(self, num_rounds: int) -> FTRLSpec:
        """The spec built for ``num_rounds`` (bound here unless the run bound it)."""
        return self if self.num_rounds is not None else self.bound(num_rounds=num_rounds)

    def noise_search(self, target_epsilon: float, num_rounds: int) -> NoiseSearch:
        """The default search (the enforced participation, not the cohort's sampling, is
        accounted: no bracket from another sampling)."""
        return NoiseSearch()

    def with_noise(self, noise: float, target_epsilon: float | None = None) -> FTRLSpec:
        """A copy with ``noise_multiplier`` = ``noise`` keeping the computed strategy (its
        optimisation and sensitivities do not depend on the noise)."""
        new = super().with_noise(noise, target_epsilon)
        for name in (
            "strategy",
            "participation_sensitivity",
            "prefix_sensitivities",
            "verification",
        ):
            if name in self.__dict__:
                new.__dict__[name] = self.__dict__[name]
        return new

    # ---- the start-up check and the summary ----------------------------------------------
    def startup_check(self) -> dict[str, float]:
        """:meth:`verify_strategy`, once per spec."""
        return self.verification

    @cached_property
    def verification(self) -> dict[str, float]:
        """Sensitivities from the MATERIALISED noise-generating matrix of the stream (n <=
        :data:`MATERIALIZE_MAX_ROUNDS`) against the analytic ones; figures for results.json.

        Raises
        ------
        ConfigError
            When a materialised sensitivity exceeds the analytic one by more than 1e-6
            (relative): the accountant would under-report ε; the run stops.
        """
        n, pattern, f = self.rounds, self.pattern, self.strategy
        out = {"sensitivity": self.prefix_sensitivities[-1][1]}
        out["participation_sensitivity"] = self.participation_sensitivity
        if n > MATERIALIZE_MAX_ROUNDS:
            return out
        single = Participation(kind=ParticipationKind.SINGLE)
        for key, pat in (("participation_sensitivity", single), ("sensitivity", pattern)):
            got = f.materialized_sensitivity(pat, n)
            out[f"materialized_{key}"] = got
            if got > out[key] * (1 + 1e-6):
                raise ConfigError(
                    "privacy.factorization",
                    self.factorization.value,
                    f"cannot run: its noise stream's materialised {key} {got:.9g} exceeds the "
                    f"analytic {out[key]:.9g} the accountant uses (the stream does not "
                    "generate the accounted noise)",
                )
        return out

    def extra_summary(self) -> dict[str, Any]:
        """The unit, mechanism, pattern and (once bound) the strategy's figures."""
        out: dict[str, Any] = {
            "privacy_unit": "client",
            "mechanism": "correlated_gaussian",
            "neighboring_relation": self.neighboring_relation.value,
            "prefix_bound": "amplified_bandmf" if self.amplified else "gdp_prefix",
        }
        if self.num_rounds is None:
            return out
        n = self.rounds
        out.update(
            effective_bands=self.effective_bands
            if self.factorization is FactorizationKind.BANDED
            else None,
            participation_sensitivity=self.participation_sensitivity,
            sensitivity=self.prefix_sensitivities[-1][1],
            max_participations_in_run=self.pattern.max_participations_in(n),
            workload_rmse=self.strategy.workload_error(self.pattern, n),
            noise_vectors=self.strategy.noise_vectors(n),
        )
        if "verification" in self.__dict__:
            out.update(self.verification)
        if self.noise_multiplier is not None and not self.amplified:
            out["effective_noise_multiplier"] = (
                self.sigma * self.participation_sensitivity / out["sensitivity"]
                if self.sigma
                else 0.0
            )
        return out

    def lower_bound(self, num_rounds: int) -> LowerBound:
        """:data:`LOWER_BOUND_METHOD` after the n rounds (:mod:`fedpriv.accounting.ftrl.lower`;
        the noise matrix is materialised up to :data:`MATERIALIZE_MAX_ROUNDS` rounds)."""
        if self.non_private:
            return LowerBound(math.inf, "exact: noise_multiplier=0 releases without noise")
        if self.rounds > MATERIALIZE_MAX_ROUNDS:
            return LowerBound.not_available(
                f"the noise matrix is not materialised beyond {MATERIALIZE_MAX_ROUNDS} rounds"
            )
        scale = self.sigma * self.participation_sensitivity
        m = self.strategy.noise_matrix(self.rounds)
        events = lower_bound_events(m, scale, self.pattern, self.amplified)
        if events is None:
            return LowerBound.not_available("the amplified rounds of a group are not independent")
        return LowerBound.of_events(events, self.target_delta, LOWER_BOUND_METHOD)


def _key(name: str) -> str:
    """The config key of a field (``num_rounds`` is a run key, the others ``privacy.*``)."""
    return name if name == "num_rounds" else f"privacy.{name}"


def _group_rounds(server_round: int, separation: int) -> int:
    """Rounds 1, b + 1, 2b + 1, ... up to ``server_round``: the first group's rounds."""
    return 0 if server_round <= 0 else (server_round - 1) // separation + 1


def _checkpoints(num_rounds: int, pattern: Participation, bands: int | None) -> list[int]:
    """Rounds where the prefix sensitivity is evaluated (each round uses the next one's).

    Banded strategies (``bands`` given; the identity has one band): the rounds 1 + jb where a
    participation can start, for j < k, and the round from which k complete columns fit,
    (k - 1) b + bands: from there s_t is s_n. Others: a geometric grid of
    :data:`PREFIX_CHECKPOINTS` rounds ending at n."""
    n = num_rounds
    if bands is not None:
        k, b = pattern.max_participations_in(n), pattern.separation
        points = {1 + j * b for j in range(k) if 1 + j * b <= n}
        points |= {min(n, (k - 1) * b + bands), n}
    else:
        steps = PREFIX_CHECKPOINTS - 1
        points = {max(1, round(n ** (i / steps))) for i in range(steps + 1)} | {n}
    return sorted(points)
