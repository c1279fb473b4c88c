"""Accounting of generalized DP-SGD with shuffling / subsampling and batch clipping.

Which analysis answers (:class:`Analysis`; ``auto``, the default, is the tightest valid one):

* subsampling (each round draws its ``m s`` of ``N`` records without replacement,
  independently): the fixed-size sampled Gaussian, replace-one, sensitivity ``2C``, noise std
  ``2 C sigma`` (multiplier ``z = 2 sigma`` per unit ``C``): one
  :class:`~fedpriv.accounting.samplers.fixed_size.WithoutReplacementGaussianEvent` per round
  composed by the PLD ledger (its dominating pair, Lebeda et al. arXiv:2405.20769), or with
  ``privacy.accountant=rdp`` dp-accounting's ``SampledWithoutReplacementDpEvent`` (Wang, Balle,
  Kasiviswanathan arXiv:1808.00087, Thm. 9); the event is built by
  :func:`~fedpriv.accounting.samplers.fixed_size.fixed_size_gaussian_event`, as for
  client-level fixed-size cohorts. Hypotheses: the rounds' batches are independent uniform
  ``m s``-subsets; a replaced record changes one group's update, whose clip bounds the change
  of ``U`` by ``2C`` whatever the (non-linear) local optimizer. ``analysis=without-replacement``.
* shuffling: the paper's f-DP mixture below (``analysis=paper``). No random-allocation
  reduction is adopted, because none was found valid for this relation: the allocation
  analyses (Feldman, Shenfeld arXiv:2602.17284) bound an add/remove pair in which the rest
  of the output does not depend on where the unit lands. In a shuffled epoch under
  replace-one, the position of the replaced record also decides which other records fill
  every round (the permutation places them around it), so the other
  rounds' releases are a mixture that depends on the record's round; each round releases a
  sum of CLIPPED group updates, non-linear in the group's records, so those baselines do not
  cancel; and ``N - R m s`` records are left out of each epoch. A dominating pair for that
  mixture (e.g. "record in round i shifts round i by ``2C``, the rest fixed") would need a
  proof that the round-dependent baselines cannot help the adversary; we have none, and a
  Monte Carlo check cannot replace it, so shuffling keeps the paper's analysis (an upper
  bound) and :mod:`.batch_clipping_lower` reports how far it may be from the truth.
* groups of ``g > 1`` records (``auto`` and ``without-replacement``): the SMALLER of two valid
  bounds, the paper's exact mixture for ``g`` and group privacy (:mod:`.group_privacy`, Vadhan
  2017 Lemma 2.2: ``(ε, δ)`` for one record gives ``(g ε, g e^{(g-1) ε} δ)`` for ``g``
  replaced records) applied to the ``g = 1`` profile of the analysis; ``analysis=paper``
  reports the mixture alone.
* Poisson sampling: dp-accounting's Poisson-sampled Gaussian (``analysis=poisson-gaussian``,
  add/remove, noise ``N(0, (C sigma)^2)``).

The paper's analysis (``analysis=paper``):

A client holds ``N = num_samples`` records. Each epoch has ``R = N // (m s)`` local rounds
(``m = num_groups`` groups of ``s = group_size`` records per round; the ``N - R m s`` records
left over by a shuffled epoch are not used in it). Round ``b`` sums the clipped group updates
and adds ``N(0, (2 C sigma)^2 I)``. For data sets differing in ``g = group_privacy`` records
(replace relation), a round whose differing records fall into ``k`` of its groups has l2
sensitivity ``2 k C`` and is ``G_{k/sigma}``-DP. Given the sampling, the whole run is
``G_{c/sigma}``-DP with ``c^2 = sum_rounds k^2``; revealing ``c`` to the adversary gives the
mixture profile ``delta(eps) = sum_c q(c) delta_{G_{c/sigma}}(eps)`` (see
:mod:`fedpriv.accounting.accountants.gdp`).

The law ``q`` of ``t = c^2`` is computed exactly by
:mod:`fedpriv.accounting.samplers.batch_groups` (the sampler) and the mixture profile by
:mod:`fedpriv.accounting.loss_models.gaussian_mixture` (the loss model); this module states
the event (:class:`BatchClippingEvent`), the spec and the CLI.

References
----------
van Dijk, Nguyen, Nguyen, Phan, "Generalizing DP-SGD with Shuffling and Batch Clipping"
(arXiv:2212.05796): Algorithm 1, Section 5 (definition of q_E(c), Lemma B.1, Theorems 5.5 /
5.6), Table 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, ClassVar

import numpy as np

from fedpriv.accounting.accountants import gdp
from fedpriv.accounting.batch_clipping.lower import ALPHA, batch_clipping_lower_bound
from fedpriv.accounting.core.calibrate import COARSE_SEARCH, NoiseSearch
from fedpriv.accounting.core.event import FedprivEvent
from fedpriv.accounting.core.group_privacy import group_privacy_delta, group_privacy_epsilon
from fedpriv.accounting.core.ledger import PrivacyLedger
from fedpriv.accounting.core.lower_report import LowerBound
from fedpriv.accounting.core.params import CliKeys, Key
from fedpriv.accounting.core.privacy_spec import EventRuns, PrivacySpec, calibrated_value
from fedpriv.accounting.core.vocabulary import Accountant, Conversion, NeighboringRelation
from fedpriv.accounting.dpsgd import poisson_gaussian_event
from fedpriv.accounting.loss_models.discrete_gaussian import DiscreteGaussianEvent
from fedpriv.accounting.loss_models.gaussian_mixture import (
    batch_clipping_delta,
    batch_clipping_epsilon,
    worst_case_mu,
)
from fedpriv.accounting.loss_models.gaussian_mixture import (
    check_noise_multiplier as _check_sigma,
)
from fedpriv.accounting.samplers.batch_groups import (
    MAX_GROUP_PRIVACY,
    SAMPLINGS,
    SumSquaresLaw,
    sum_squares_law,
)
from fedpriv.accounting.samplers.batch_groups import validate_sizes as _validate
from fedpriv.accounting.samplers.fixed_size import fixed_size_gaussian_event
from fedpriv.common.errors import ConfigError, check
from fedpriv.common.validate import check_finite, parse_enum
from fedpriv.mechanisms.lattice_gaussian import lattice_noise_multiplier
from fedpriv.mechanisms.samplers import SamplerKind

__all__ = [
    "Analysis",
    "BatchClippingSpec",
    "DEFAULT_GROUP_SIZES",
    "BatchClippingEvent",
    "table1_mu",
    "calibrate_noise_multiplier",
]


def calibrate_noise_multiplier(
    law: SumSquaresLaw, target_epsilon: float, target_delta: float
) -> float:
    """Smallest ``noise_multiplier`` (to 1e-6 relative) whose mixture delta meets the targets.

    Bisection on the exact mixture delta, which decreases in sigma; the returned value is
    the upper end of the final bracket, so it always meets the target.

    Raises
    ------
    ConfigError
        If the targets are out of range.
    """
    eps = float(target_epsilon)
    check(eps >= 0.0, "target_epsilon", target_epsilon, "must be >= 0")
    check(0.0 < target_delta < 1.0, "target_delta", target_delta, "must be in (0, 1)")
    if law.components()[0].max() == 0.0:
        return 0.0

    def ok(sig: float) -> bool:
        return batch_clipping_delta(law, sig, eps) <= target_delta

    lo, hi = 0.0, 1.0
    while not ok(hi):
        lo, hi = hi, hi * 2.0
        check(hi < 1e12, "target_epsilon", target_epsilon, "is not reachable")
    while hi - lo > 1e-6 * hi:
        mid = 0.5 * (lo + hi)
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


# --------------------------------------------------------------------------- closed forms
def table1_mu(
    num_groups: int, group_size: int, epochs: float, noise_multiplier: float, group_privacy: int = 1
) -> tuple[float, str]:
    """The paper's Table 1 closed form for this clipping mode.

    Returns ``(mu, formula)``: batch clipping (``m = 1``) ``sqrt(g E)/sigma``; individual
    clipping (``s = 1``) or both ``m, s > 1`` the worst case ``g sqrt(E)/sigma``.
    """
    sigma = _check_sigma(noise_multiplier)
    g = group_privacy
    if num_groups == 1:
        num, formula = math.sqrt(g * epochs), "G_{sqrt(g E)/sigma}"
    else:
        num, formula = g * math.sqrt(epochs), "G_{g sqrt(E)/sigma}"
    mu = math.inf if sigma == 0 and num > 0 else (0.0 if num == 0 else num / sigma)
    return mu, formula


# --------------------------------------------------------------------------- ledger event
@dataclass(frozen=True)
class BatchClippingEvent(FedprivEvent):
    """One local round of Algorithm 1 (batch or individual clipping, fixed-size batches).

    Parameters
    ----------
    sampling : {"shuffle", "subsample"}
    num_samples : int
        ``N``, records of the client.
    num_groups : int
        ``m``, groups (clipped updates) per round.
    group_size : int
        ``s``, records per group.
    noise_multiplier : float
        ``sigma``: the noise is ``N(0, (2 C sigma)^2 I)``.
    group_privacy : int
        ``g``, size of the groups of records protected (1 = record-level).
    tail_tol : float
        See :func:`~fedpriv.accounting.samplers.batch_groups.sum_squares_law`.

    Notes
    -----
    ``count`` in :meth:`epsilon` / :meth:`delta` is the number of local rounds run so far;
    epochs are ``count // (N // (m s))``. Events with different parameters do not compose
    through this class (the mixture is over the whole run).
    """

    sampling: str
    num_samples: int
    num_groups: int
    group_size: int
    noise_multiplier: float
    group_privacy: int = 1
    tail_tol: float = 1e-30

    supported_relations: ClassVar[frozenset[str]] = frozenset({"replace_one"})

    def __post_init__(self) -> None:
        _validate(
            self.sampling, self.num_samples, self.num_groups, self.group_size, self.group_privacy
        )
        _check_sigma(self.noise_multiplier)

    @property
    def rounds_per_epoch(self) -> int:
        """``N // (m s)``."""
        return self.num_samples // (self.num_groups * self.group_size)

    def law(self, count: int) -> SumSquaresLaw:
        """The law ``q`` of ``c^2`` after ``count`` rounds."""
        return sum_squares_law(
            self.sampling,
            self.num_samples,
            self.num_groups,
            self.group_size,
            int(count),
            self.group_privacy,
            self.tail_tol,
        )

    def epsilon(self, target_delta: float, count: int = 1) -> float:
        """Exact mixture epsilon after ``count`` rounds."""
        return batch_clipping_epsilon(self.law(count), self.noise_multiplier, target_delta)

    def delta(self, target_epsilon: float, count: int = 1) -> float:
        """Exact mixture delta after ``count`` rounds."""
        return batch_clipping_delta(self.law(count), self.noise_multiplier, target_epsilon)


# --------------------------------------------------------------------------- the family spec
#: Group sizes ``g`` whose ε is reported when ``privacy.group_sizes`` is null.
DEFAULT_GROUP_SIZES = (1, 2, 4, 8)
#: What answers for ε under ``analysis=paper`` (shuffling or subsampling), whatever the accountant.
PAPER_ACCOUNTING = (
    "the paper's f-DP mixture (arXiv:2212.05796 Sec. 5, replace-one; the adversary learns "
    "c^2 = sum k^2); privacy.accountant and privacy.conversion do not apply"
)
#: What answers for ε under ``analysis=without-replacement`` (``{}``: PLD or RDP (conversion)).
SAMPLED_ACCOUNTING = "fixed-size sampled Gaussian {} (replace-one, sensitivity 2C)"
#: Appended when groups g > 1 take the smaller of two bounds.
GROUP_RULE = (
    "; groups g > 1: the smaller of the paper's f-DP mixture for g and group privacy "
    "(Vadhan 2017, Lemma 2.2) of g = 1"
)


class Analysis(StrEnum):
    """Which analysis accounts a :class:`BatchClippingSpec` (see the module docstring).

    ``auto`` (default): the tightest valid one for the sampler: ``without-replacement`` for
    subsampling, ``paper`` for shuffling, ``poisson-gaussian`` for Poisson, and for groups
    ``g > 1`` the smaller of the mixture and group privacy of ``g = 1``.
    ``without-replacement``: the fixed-size sampled Gaussian (subsampling only).
    ``paper``: the first paper's exact f-DP mixture (fixed-size batches, replace-one; its
    earlier spelling ``batch-clipping`` is still accepted). ``poisson-gaussian``: dp-accounting's
    Poisson-sampled Gaussian (Poisson sampling, add/remove). Any other pairing is refused: it
    would under-report ε.
    """

    AUTO = "auto"
    WITHOUT_REPLACEMENT = "without-replacement"
    PAPER = "paper"
    POISSON_GAUSSIAN = "poisson-gaussian"

    @classmethod
    def _missing_(cls, value: object) -> Analysis | None:
        """``batch-clipping`` (the name before issue 40) is the paper's mixture."""
        return cls.PAPER if value == "batch-clipping" else None


def check_fixed_size_analysis(analysis: Analysis, sampler: SamplerKind, field_name: str) -> None:
    """Refuse an analysis that does not cover fixed-size batches from ``sampler``.

    Raises
    ------
    ConfigError
        ``poisson-gaussian`` (under-reports ε for fixed-size batches), or
        ``without-replacement`` with shuffling (its rounds are not independent draws).
    """
    check(
        analysis is not Analysis.POISSON_GAUSSIAN,
        field_name,
        analysis.value,
        f"does not cover sampler={sampler.value!r}: the Poisson analysis under-reports "
        f"epsilon for shuffled or fixed-size batches; use {field_name}=auto or "
        f"{field_name}=paper",
    )
    check(
        analysis is not Analysis.WITHOUT_REPLACEMENT or sampler is SamplerKind.SUBSAMPLE,
        field_name,
        analysis.value,
        f"does not cover sampler={sampler.value!r}: a shuffled epoch's rounds are not "
        f"independent draws; use {field_name}=auto or {field_name}=paper",
    )


def _group_epsilon(group_privacy: int, count: int) -> Callable[[BatchClippingSpec], float]:
    """``spec -> spec.group_epsilon(group_privacy, count)`` (what calibration bisects)."""
    return lambda spec: spec.group_epsilon(group_privacy, count)


def _int_at_least(field_name: str, value: Any, lo: int = 1) -> int:
    check(
        bool(isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= lo),
        field_name,
        value,
        f"must be an integer >= {lo}",
    )
    return int(value)


# --------------------------------------------------------------------------- fedpriv-account
#: What ``lower_bound=true`` answers (:mod:`fedpriv.accounting.batch_clipping.lower`).
LOWER_BOUND_METHOD = {
    SamplerKind.SUBSAMPLE: "optimistic PLD of the fixed-size sampled Gaussian pair of one "
    "record (+C replaced by -C) in every round",
    SamplerKind.SHUFFLE: "the largest of: each epoch's first round alone, the random "
    f"allocation of a +C record to one of the epoch's rounds (optimistic PLDs), and the "
    f"full-shift pair by seeded Monte Carlo (one-sided confidence {1 - ALPHA:g})",
}
#: ``sampling``: the fixed-size samplers this analysis covers (the ``sampler`` field).
SAMPLING_KEY = Key(
    name="sampling",
    kind=SamplerKind,
    default=SamplerKind.SHUFFLE,
    field="sampler",
    choices=SAMPLINGS,
    refusal="is not covered by the batch-clipping analysis (fixed-size batches: shuffle or "
    "subsample); use the poisson-gaussian analysis for Poisson sampling with individual "
    "clipping and noise N(0,(C sigma)^2)",
    doc="shuffle (a permutation per epoch) or subsample (m*s of N, independently per round)",
)
#: ``group_privacy``: the group of records whose ε is answered (``group_sizes = (g,)``).
GROUP_KEY = Key(
    name="group_privacy",
    kind=int,
    default=1,
    limits={"ge": 1},
    doc="g: answer epsilon for groups of g records (the paper's mixture for g, or group "
    "privacy of g = 1, whichever is smaller)",
)


def _cli_fields(values: dict[str, Any]) -> dict[str, Any]:
    """``epochs`` or ``local_rounds`` (exactly one; one epoch when neither), the sizes and
    the group checked as the CLI names them, ``group_sizes = (group_privacy,)``."""
    epochs, local = values["epochs"], values["local_rounds"]
    if epochs is not None and local is not None:
        raise ConfigError("local_rounds", local, "cannot be combined with epochs; give one")
    sampler, g = values["sampling"], values["group_privacy"]
    n, m, s = values["num_samples"], values["num_groups"], values["group_size"]
    _validate(sampler.value, n, m, s, g)
    check_fixed_size_analysis(values["analysis"], sampler, "analysis")
    return {"group_sizes": (g,), "epochs": 1 if epochs is None and local is None else epochs}


def _group(spec: Any, num_rounds: int) -> tuple[int, int]:
    """The group answered for and the local rounds after ``num_rounds`` server rounds."""
    return spec.report_group_sizes[0], num_rounds * spec.rounds_per_server_round


def _cli_epsilon(spec: Any, num_rounds: int) -> float:
    g, rounds = _group(spec, num_rounds)
    return float(spec.group_epsilon(g, rounds))


def _cli_delta(spec: Any, epsilon: float, num_rounds: int) -> float:
    g, rounds = _group(spec, num_rounds)
    return float(spec.group_delta(g, rounds, epsilon))


def _cli_calibrated(spec: Any, target: float, num_rounds: int) -> Any:
    """``spec.calibrated`` for one record; for a group of g the smallest σ whose group ε
    meets the target (:meth:`BatchClippingSpec.calibrated_sigma`)."""
    g, rounds = _group(spec, num_rounds)
    if g == 1:
        return spec.calibrated(target, num_rounds)
    return spec.with_noise(spec.calibrated_sigma(target, rounds, g), target)


def _cli_report(spec: Any, num_rounds: int) -> dict[str, Any]:
    """The analysis used, the mechanism's sizes, the paper's mixture ε and its law ``q_E``
    ({"t": probability}, ``t = c^2 = sum k^2``), the Table 1 closed form and the worst case."""
    g, rounds = _group(spec, num_rounds)
    law, sigma, d = spec.law(rounds, g), spec.sigma, spec.target_delta
    mu_t1, formula = table1_mu(
        spec.num_groups, spec.group_size, rounds / spec.rounds_per_epoch, sigma, g
    )
    mu_wc = worst_case_mu(law, sigma)
    return {
        "analysis_used": spec.analysis_name.value,
        "accounting": spec.accounting_description(),
        "sampling": spec.sampler.value,
        "rounds_per_epoch": spec.rounds_per_epoch,
        "rounds": rounds,
        "group_privacy": g,
        "normalizer": spec.normalizer,
        "noise_multiplier": sigma,
        "paper_epsilon": batch_clipping_epsilon(law, sigma, d),
        "closed_form": {
            "formula": formula,
            "mu": mu_t1,
            "epsilon": gdp.gdp_epsilon(d, mu_t1),
            "kind": (
                "upper bound (shuffling)"
                if spec.sampler is SamplerKind.SHUFFLE
                else "approximation (Table 1, large N); not a bound for subsampling"
            ),
        },
        "worst_case": {"mu": mu_wc, "epsilon": gdp.gdp_epsilon(d, mu_wc)},
        "lumped_mass": law.lumped_mass,
        "mean_c2": law.mean(),
        "q_E": {str(t): q for t, q in sorted(law.as_dict().items())},
    }


@dataclass(frozen=True, kw_only=True)
class BatchClippingSpec(PrivacySpec):
    """Generalized DP-SGD (Algorithm 1 of the first paper): one client's release, typed.

    Built by BOTH the client algorithm :class:`clients.generalized_dpsgd.GeneralizedDPSGD`
    (``privacy=batch_clipping``, the run's facts bound by the client) and ``fedpriv-account
    batch-clipping`` (``spec_from_params``), so the CLI prints exactly a run's ε. Each client's
    release carries its own noise and is private on its own (no secure aggregation assumed):
    ``noise_multiplier`` is σ of ONE client's release.

    Per local round a client clips ``m`` group updates to ``C`` (``clipping_norm``), sums them
    (``U``), adds ``N(0, (2 C σ)^2 I)`` (``N(0, (C σ)^2 I)`` for Poisson) and steps by
    ``η_t (U + noise) / m``. The divisor :attr:`normalizer` ``= m`` is a public constant of
    the config, the same for every client: a record's influence on ``U`` and the noise are
    scaled alike, so every record's noise per unit sensitivity is σ whatever the client's size.

    Parameters
    ----------
    noise_multiplier : float or None
        σ >= 0, finite (0: no privacy): the noise std per unit sensitivity of each local
        round's release; ``None`` with ``target_epsilon`` (calibrated by the run).
    clipping_norm : float
        ``C`` > 0, finite: the clip of one group's update (real units).
    sample_rate : float
        ``q`` in (0, 1]: each record's probability to be in a local round's batch (Poisson
        sampling only; unused by shuffling and subsampling).
    group_sizes : tuple of int, optional
        ``g`` values whose group ε :meth:`report` computes (each <= ``N`` and <= 64); ``None``
        = those of (1, 2, 4, 8) that are <= ``N`` for fixed-size batches, none for Poisson (an
        explicit value is refused there): :attr:`report_group_sizes`.
    sampler : SamplerKind
        ``shuffle`` | ``subsample`` (fixed-size batches over the client's first ``N`` records)
        or ``poisson`` (every record of the client independently with probability ``q``;
        individual clipping, ``group_size = 1``). Bound by the client (``client.sampler``).
    num_groups : int
        ``m`` >= 1, clipped group updates per local round (for Poisson: the public expected
        batch size that divides the noisy sum). Bound (``client.num_groups``).
    group_size : int
        ``s`` >= 1, records per group (``m s <= N``). Bound (``client.group_size``).
    epochs, local_rounds : int, optional
        Whole epochs (``N // (m s)`` local rounds each; ``round(1/q)`` for Poisson) or local
        rounds per server round; exactly one. Every client runs the same number. Bound.
    num_samples : int, optional
        ``N``: records each client uses (shuffle/subsample; the smallest partition, bound by
        :meth:`clients.generalized_dpsgd.GeneralizedDPSGD.for_run`). Under the replace-one
        relation every client's size is the same in neighbouring data sets, so ``N`` is public.
        Unused (``None``) with Poisson sampling, whose analysis needs no data size.
    analysis : Analysis
        ``auto``, or the one analysis that fits the sampler (bound, ``client.analysis``).
    lattice_noise : bool
        The noise is a discrete Gaussian on the lattice ``γℤ^d``
        (:mod:`fedpriv.mechanisms.lattice_gaussian`; bound by the client in
        ``privacy.secure_mode`` with Poisson sampling and ``privacy.accountant=rdp``).
    (and the fields of :class:`~fedpriv.accounting.core.privacy_spec.PrivacySpec`; the neighbouring
    relation follows the sampler: replace-one for fixed-size batches, add/remove for Poisson)

    Raises
    ------
    ConfigError
        On any out-of-range, non-finite or uncovered setting, naming the config field.

    References
    ----------
    van Dijk, Nguyen, Nguyen, Phan, "Generalizing DP-SGD with Shuffling and Batch Clipping"
    (arXiv:2212.05796): Algorithm 1, Sec. 3, Sec. 5 (Lemma B.1, Theorems 5.5/5.6), Table 1.
    """

    family: ClassVar[str] = "batch_clipping"
    bound_fields: ClassVar[tuple[str, ...]] = (
        *PrivacySpec.bound_fields,
        "sampler",
        "num_groups",
        "group_size",
        "epochs",
        "local_rounds",
        "num_samples",
        "analysis",
        "lattice_noise",
    )
    cli: ClassVar[CliKeys] = CliKeys(
        doc="generalized DP-SGD (shuffling or subsampling, batch clipping): epsilon of one "
        "client's release for a group of group_privacy records (the run's BatchClippingSpec)",
        takes=("num_groups", "group_size", "epochs", "local_rounds", "num_samples", "analysis"),
        hide=("sample_rate", "group_sizes"),
        required=("num_samples",),
        defaults={"epochs": None},
        limits={"epochs": {"le": 100_000}, "local_rounds": {"le": 10**8}},
        aliases={"sampling": "sampler", "group_privacy": "group_sizes"},
        extra=(SAMPLING_KEY, GROUP_KEY),
        rounds=Key(
            name="num_rounds",
            kind=int,
            default=1,
            limits={"ge": 1, "le": 100_000},
            doc="server rounds (each runs epochs or local_rounds local rounds)",
        ),
        delta_at_epsilon=True,
        derive=_cli_fields,
        epsilon=_cli_epsilon,
        delta=_cli_delta,
        calibrate=_cli_calibrated,
        report=_cli_report,
    )

    noise_multiplier: float | None = 1.2
    clipping_norm: float = 1.0
    sample_rate: float = 0.1
    group_sizes: tuple[int, ...] | None = None
    sampler: SamplerKind = SamplerKind.SHUFFLE
    num_groups: int = 1
    group_size: int = 64
    epochs: int | None = 1
    local_rounds: int | None = None
    num_samples: int | None = None
    analysis: Analysis = Analysis.AUTO
    lattice_noise: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        set_ = object.__setattr__
        set_(self, "sampler", parse_enum(SamplerKind, "client.sampler", self.sampler))
        set_(self, "analysis", parse_enum(Analysis, "client.analysis", self.analysis))
        set_(self, "num_groups", _int_at_least("client.num_groups", self.num_groups))
        set_(self, "group_size", _int_at_least("client.group_size", self.group_size))
        self._check_rounds()
        set_(self, "noise_multiplier", self.noise_or_target(self.noise_multiplier))
        clip = check_finite(
            "privacy.clipping_norm", self.clipping_norm, "must be a finite number > 0"
        )
        check(clip > 0, "privacy.clipping_norm", clip, "must be > 0")
        set_(self, "clipping_norm", clip)
        q = check_finite("privacy.sample_rate", self.sample_rate, "must be in (0, 1]")
        check(0 < q <= 1, "privacy.sample_rate", q, "must be in (0, 1]")
        set_(self, "sample_rate", q)
        self._check_analysis()
        set_(self, "group_sizes", self._checked_groups())
        if self.num_samples is not None:
            set_(self, "num_samples", _int_at_least("client.num_samples", self.num_samples))
            self._check_batch_fits()
        check(
            not self.lattice_noise or (self.is_poisson and self.accountant is Accountant.RDP),
            "privacy.lattice_noise",
            self.lattice_noise,
            "needs client.sampler=poisson and privacy.accountant=rdp (the discrete Gaussian "
            "is accounted by its RDP curve; the f-DP mixture assumes continuous noise)",
        )

    def _check_rounds(self) -> None:
        check(
            (self.local_rounds is None) != (self.epochs is None),
            "client.local_rounds",
            self.local_rounds,
            f"and client.epochs={self.epochs!r}: give exactly one",
        )
        set_ = object.__setattr__
        if self.epochs is not None:
            set_(self, "epochs", _int_at_least("client.epochs", self.epochs))
        if self.local_rounds is not None:
            set_(self, "local_rounds", _int_at_least("client.local_rounds", self.local_rounds))

    def _check_analysis(self) -> None:
        """Refuse an analysis that does not fit the sampler, and Poisson with groups."""
        analysis = self.analysis
        if self.is_poisson:
            check(
                analysis in (Analysis.AUTO, Analysis.POISSON_GAUSSIAN),
                "client.analysis",
                analysis.value,
                "does not cover sampler='poisson' (variable-size batches); "
                "use client.analysis=poisson-gaussian",
            )
            check(
                self.group_size == 1,
                "client.group_size",
                self.group_size,
                "must be 1 with sampler=poisson: only individual clipping has a Poisson "
                "analysis (noise N(0,(C sigma)^2))",
            )
            return
        check_fixed_size_analysis(analysis, self.sampler, "client.analysis")

    def _check_batch_fits(self) -> None:
        """``m s <= N`` and every group size <= ``N`` (fixed-size batches)."""
        if self.is_poisson:
            return
        n, m, s = self.samples_used, self.num_groups, self.group_size
        check(
            m * s <= n,
            "client.num_groups",
            m,
            f"times client.group_size={s} must be <= the client's {n} samples",
        )
        check(
            all(g <= n for g in self.group_sizes or ()),
            "privacy.group_sizes",
            list(self.group_sizes or ()),
            f"must all be <= the client's {n} samples",
        )

    def _checked_groups(self) -> tuple[int, ...] | None:
        """The configured group sizes as a tuple (``None`` stays: the default)."""
        if self.group_sizes is None:
            return None
        groups = list(self.group_sizes)
        check(
            not self.is_poisson,
            "privacy.group_sizes",
            groups,
            "is not computed with client.sampler=poisson (no group analysis of Poisson "
            "sampling here); leave it null",
        )
        check(
            len(groups) >= 1
            and all(
                isinstance(g, (int, np.integer)) and not isinstance(g, bool) and g >= 1
                for g in groups
            ),
            "privacy.group_sizes",
            groups,
            "must all be integers >= 1",
        )
        check(
            max(groups) <= MAX_GROUP_PRIVACY,
            "privacy.group_sizes",
            groups,
            f"must all be <= {MAX_GROUP_PRIVACY} (exact q_E is computed up to that size)",
        )
        return tuple(int(g) for g in groups)

    # ------------------------------------------------------------------ derived values
    @property
    def neighboring_relation(self) -> NeighboringRelation:
        """Replace-one for fixed-size batches (the mixture analysis); add/remove for Poisson."""
        if self.is_poisson:
            return NeighboringRelation.ADD_REMOVE
        return NeighboringRelation.REPLACE_ONE

    @property
    def is_poisson(self) -> bool:
        """Whether the sampler is Poisson (add/remove, dp-accounting's analysis)."""
        return self.sampler is SamplerKind.POISSON

    @property
    def non_private(self) -> bool:
        return self.noise_multiplier == 0

    @property
    def sigma(self) -> float:
        """``noise_multiplier`` as a number (refused before calibration)."""
        return calibrated_value("noise_multiplier", self.noise_multiplier)

    @property
    def analysis_name(self) -> Analysis:
        """The analysis that accounts one record (``auto`` resolved): ``poisson-gaussian``
        (Poisson), ``without-replacement`` (subsampling), ``paper`` (shuffling)."""
        if self.is_poisson:
            return Analysis.POISSON_GAUSSIAN
        if self.analysis is not Analysis.AUTO:
            return self.analysis
        if self.sampler is SamplerKind.SUBSAMPLE:
            return Analysis.WITHOUT_REPLACEMENT
        return Analysis.PAPER

    @property
    def report_group_sizes(self) -> tuple[int, ...]:
        """The ``g`` whose group ε :meth:`report` computes: ``group_sizes``, or by default
        those of (1, 2, 4, 8) that are <= ``N`` (fixed-size batches; none for Poisson)."""
        if self.group_sizes is not None:
            return self.group_sizes
        if self.is_poisson:
            return ()
        n = self.num_samples
        return tuple(g for g in DEFAULT_GROUP_SIZES if n is None or g <= n)

    @property
    def normalizer(self) -> float:
        """``m``: the PUBLIC divisor of every noisy step ``(U + noise) / m`` (same for all
        clients, never computed from a client's data)."""
        return float(self.num_groups)

    @property
    def samples_used(self) -> int:
        """``N`` as a number.

        Raises
        ------
        ConfigError
            Before the client bound it (``num_samples=None``).
        """
        if self.num_samples is None:
            raise ConfigError(
                "client.num_samples", None, "is unknown: bind the algorithm with for_run(plan)"
            )
        return int(self.num_samples)

    @property
    def rounds_per_epoch(self) -> int:
        """``N // (m s)``; for Poisson ``max(1, round(1/q))`` (no data size needed)."""
        if self.is_poisson:
            return max(1, round(1.0 / self.sample_rate))
        return self.samples_used // (self.num_groups * self.group_size)

    @property
    def rounds_per_server_round(self) -> int:
        """Local rounds (noise draws) per server round: the same for every client."""
        if self.local_rounds is not None:
            return int(self.local_rounds)
        return int(self.epochs or 1) * self.rounds_per_epoch

    def noise_stddev(self, clipping_norm: float | None = None) -> float:
        """Std of the noise added to ``U``: ``2 C σ`` (``C σ`` for Poisson), before ``/ m``."""
        c = self.clipping_norm if clipping_norm is None else float(clipping_norm)
        return (1.0 if self.is_poisson else 2.0) * c * self.sigma

    def sensitivity(self, clipping_norm: float | None = None) -> float:
        """l2 sensitivity of ``U`` to one record: ``2 C`` (replace-one), ``C`` (Poisson,
        add/remove); ``noise_stddev / sensitivity = σ``."""
        c = self.clipping_norm if clipping_norm is None else float(clipping_norm)
        return c if self.is_poisson else 2.0 * c

    # ------------------------------------------------------------------ events and ε
    def event(self) -> Any:
        """One local round's privacy event for one record, under :attr:`analysis_name`: the
        fixed-size sampled Gaussian (z = 2σ per unit C, ``m s`` of ``N``;
        :func:`~fedpriv.accounting.samplers.fixed_size.fixed_size_gaussian_event`), the
        paper's mixture (:meth:`mixture_event`; also for σ = 0), or for Poisson the
        Poisson-sampled Gaussian; with :attr:`lattice_noise` the Poisson-subsampled discrete
        Gaussian, its sensitivity grown by the rounding to the lattice (CKS20,
        arXiv:2004.00010, Thm 15)."""
        if self.lattice_noise:
            z = lattice_noise_multiplier(self.sigma)
            return DiscreteGaussianEvent(z, self.sample_rate)
        if self.is_poisson:
            return poisson_gaussian_event(self.sigma, self.sample_rate)
        if self.analysis_name is Analysis.PAPER or self.sigma == 0:
            return self.mixture_event(1)
        batch = self.num_groups * self.group_size
        return fixed_size_gaussian_event(
            2.0 * self.sigma, batch, self.samples_used, self.accountant
        )

    def mixture_event(self, group_privacy: int = 1) -> BatchClippingEvent:
        """One local round under the paper's f-DP mixture for groups of ``group_privacy``
        records (fixed-size batches)."""
        return BatchClippingEvent(
            self.sampler.value,
            self.samples_used,
            self.num_groups,
            self.group_size,
            self.sigma,
            group_privacy,
        )

    def round_events(self) -> EventRuns:
        """``[(event, local rounds per server round)]``: one server round of one client."""
        return [(self.event(), self.rounds_per_server_round)]

    def degraded_round_events(self, contributors: int) -> EventRuns:
        """Each client's release carries its own noise and is private alone, so other
        clients' dropouts weaken nothing: the full round's events (an upper bound for a
        dropped client)."""
        return self.round_events()

    def accounting_description(self) -> str:
        """What answers for ε: :data:`PAPER_ACCOUNTING` or :data:`SAMPLED_ACCOUNTING` (with the
        group rule :data:`GROUP_RULE` unless ``analysis=paper``) for fixed-size batches, else
        the ledger's ``"pld"`` / ``"rdp (CONVERSION)"``."""
        if self.is_poisson:
            ledger = self.accounting.ledger()
            ledger.record(self.event(), 1)
            return str(ledger.analysis())
        if self.analysis_name is Analysis.PAPER:
            text = PAPER_ACCOUNTING
        else:
            kind = "PLD" if self.accountant is Accountant.PLD else f"RDP ({self.conversion})"
            text = SAMPLED_ACCOUNTING.format(kind)
        return text if self.analysis is Analysis.PAPER else text + GROUP_RULE

    def law(self, num_local_rounds: int, group_privacy: int = 1) -> SumSquaresLaw:
        """The law ``q`` of ``c^2`` after ``num_local_rounds`` (fixed-size batches only; the
        same law :class:`BatchClippingEvent` composes)."""
        check(not self.is_poisson, "client.sampler", self.sampler.value, "has no q_E law")
        return sum_squares_law(
            self.sampler.value,
            self.samples_used,
            self.num_groups,
            self.group_size,
            int(num_local_rounds),
            group_privacy,
        )

    def report(self, rounds: int) -> dict[str, float]:
        """``epsilon_g{g}`` (:meth:`group_epsilon`: the analysis of one record for g = 1, the
        group rule for g > 1) and ``epsilon_g{g}_closed`` (Table 1 closed form) for each ``g``
        in :attr:`report_group_sizes` after ``rounds`` server rounds, at ``target_delta``;
        ``{}`` for Poisson or before any round.

        References
        ----------
        arXiv:2212.05796, Sec. 5 (group privacy, Theorems 5.5/5.6) and Table 1; Vadhan 2017,
        Lemma 2.2 (group privacy).
        """
        if self.is_poisson or rounds < 1:
            return {}
        count = rounds * self.rounds_per_server_round
        epochs = count / self.rounds_per_epoch
        delta = self.target_delta
        out: dict[str, float] = {}
        for g in self.report_group_sizes:
            out[f"epsilon_g{g}"] = self.group_epsilon(g, count)
            mu, _ = table1_mu(self.num_groups, self.group_size, epochs, self.sigma, g)
            out[f"epsilon_g{g}_closed"] = gdp.gdp_epsilon(delta, mu)
        return out

    def _ledger(self, count: int) -> PrivacyLedger:
        """The ledger of ``count`` local rounds for one record (what a run composes)."""
        ledger = self.accounting.ledger()
        ledger.record(self.event(), int(count))
        return ledger

    def group_epsilon(
        self, group_privacy: int, count: int, target_delta: float | None = None
    ) -> float:
        """ε at ``target_delta`` (default the spec's) after ``count`` local rounds for groups of
        ``group_privacy`` records: g = 1 the run's ledger; g > 1 with ``analysis=paper`` the
        paper's mixture for g, otherwise the smaller of that mixture and group privacy
        (:func:`~fedpriv.accounting.core.group_privacy.group_privacy_epsilon`) of the g = 1 profile.

        References
        ----------
        arXiv:2212.05796, Sec. 5 (the mixture for g); Vadhan 2017, Lemma 2.2 (group privacy;
        hypothesis: g replaced records are g replace-one steps).
        """
        delta = self.target_delta if target_delta is None else float(target_delta)
        if count == 0:
            return 0.0
        ledger = self._ledger(count)
        if group_privacy == 1:
            return float(ledger.get_epsilon(delta))
        mixture = self.mixture_event(group_privacy).epsilon(delta, count)
        if self.analysis is Analysis.PAPER:
            return mixture
        return min(mixture, group_privacy_epsilon(ledger.get_delta, group_privacy, delta))

    def group_delta(self, group_privacy: int, count: int, target_epsilon: float) -> float:
        """δ at ``target_epsilon`` after ``count`` local rounds for groups of
        ``group_privacy`` records, by the rule of :meth:`group_epsilon` (the smaller of the two
        valid δ for g > 1 unless ``analysis=paper``)."""
        if count == 0:
            return 0.0
        ledger = self._ledger(count)
        if group_privacy == 1:
            return float(ledger.get_delta(target_epsilon))
        mixture = self.mixture_event(group_privacy).delta(target_epsilon, count)
        if self.analysis is Analysis.PAPER:
            return mixture
        return min(mixture, group_privacy_delta(ledger.get_delta, group_privacy, target_epsilon))

    def calibrated_sigma(self, target_epsilon: float, count: int, group_privacy: int = 1) -> float:
        """The smallest σ (to 0.1 %) whose :meth:`group_epsilon` after ``count`` local rounds
        is <= ``target_epsilon``: the very function the run and the CLI report, searched as
        :meth:`calibrated` searches (:meth:`group_search`).

        Raises
        ------
        ConfigError
            If the target cannot be reached.
        """
        search = self.group_search(target_epsilon, count, group_privacy)
        return self.solve_noise(target_epsilon, _group_epsilon(group_privacy, count), search)

    def noise_search(self, target_epsilon: float, num_rounds: int) -> NoiseSearch:
        """:meth:`group_search` for one record over ``num_rounds`` server rounds."""
        return self.group_search(target_epsilon, num_rounds * self.rounds_per_server_round)

    def group_search(
        self, target_epsilon: float, count: int, group_privacy: int = 1
    ) -> NoiseSearch:
        """A bracket for a slow accountant from a fast one's coarse σ (checked before use): a
        Poisson PLD from the RDP answer; dp-accounting's RDP without replacement (seconds per
        σ) from the PLD answer."""
        epsilon_of = _group_epsilon(group_privacy, count)
        if self.is_poisson and self.accountant is Accountant.PLD:
            rdp = replace(self, accountant=Accountant.RDP, conversion=Conversion.DEFAULT)
            sigma = rdp.solve_noise(target_epsilon, epsilon_of, COARSE_SEARCH)
            return NoiseSearch(hint=(0.75 * sigma, sigma))
        if self.analysis_name is Analysis.WITHOUT_REPLACEMENT and self.accountant is not (
            Accountant.PLD
        ):
            pld = replace(self, accountant=Accountant.PLD, conversion=Conversion.DEFAULT)
            sigma = pld.solve_noise(target_epsilon, epsilon_of, COARSE_SEARCH)
            return NoiseSearch(hint=(sigma, 1.5 * sigma))
        return NoiseSearch()

    def extra_summary(self) -> dict[str, Any]:
        """The accounted mechanism for ``results.json``: the analysis (``auto`` resolved),
        what answers for ε, the group sizes reported, the local rounds per server round, the
        noise std per unit clipping norm, the relation and the public normalizer."""
        out: dict[str, Any] = {
            "mechanism": "gaussian",
            "analysis": self.analysis_name.value,
            "group_sizes": list(self.report_group_sizes),
            "neighboring_relation": self.neighboring_relation.value,
            "normalizer": self.normalizer,
        }
        if self.noise_multiplier is not None:
            out["noise_stddev_per_unit_clipping_norm"] = self.noise_stddev(1.0)
            if self.is_poisson or self.num_samples is not None:
                out["accounting"] = self.accounting_description()
        if self.is_poisson or self.num_samples is not None:
            out["local_rounds_per_server_round"] = self.rounds_per_server_round
        return out

    def lower_bound(self, num_rounds: int) -> LowerBound:
        """A lower bound on ε for one record after ``num_rounds`` server rounds
        (:func:`~fedpriv.accounting.batch_clipping.lower.batch_clipping_lower_bound`; valid for
        any group, loose for g > 1); none for Poisson sampling."""
        _, rounds = _group(self, num_rounds)
        if self.is_poisson:
            return LowerBound.not_available("no realised pair is computed for sampler=poisson")
        batch = self.num_groups * self.group_size
        bound = batch_clipping_lower_bound(
            self.sampler, self.samples_used, batch, rounds, self.sigma, self.target_delta
        )
        assert bound is not None  # shuffle and subsample
        method = LOWER_BOUND_METHOD[self.sampler]
        return LowerBound(bound.epsilon, method, bound.confidence, bound.detail)
