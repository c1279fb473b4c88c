"""The run plan: the whole run, typed and validated, as the driver and every worker see it.

:func:`fedpriv.run.prepare.prepare` builds it once from the composed Hydra config, before
anything is written: the top-level settings (defaults in :class:`fedpriv.run.config.RunConfig`
only), the cohort sampler, and the privacy spec, bound by the client algorithm and calibrated.
The plan then travels to every Ray worker as a typed payload (:mod:`fedpriv.common.payload`)
and is decoded into the same classes there, validated again; no ``privacy`` dict exists after
validation.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from fedpriv.accounting.core.privacy_spec import PrivacySpec
from fedpriv.common import payload
from fedpriv.common.errors import check
from fedpriv.common.validate import check_finite, parse_enum
from fedpriv.mechanisms.client_sampling import ClientSampling, CohortSampler
from fedpriv.mechanisms.enforced_cohort import AvailabilityTrace


class Device(StrEnum):
    """Where clients train: ``auto`` uses CUDA when ``client_resources.num_gpus > 0``."""

    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"


class Engine(StrEnum):
    """What runs the Flower nodes (:mod:`fedpriv.run.process_grid`, :mod:`fedpriv.run.ray_session`).

    ``processes``: worker processes forked on this machine (no Ray: start-up in a second);
    ``ray``: Flower's Ray backend (a cluster, SecAgg+, GPUs); ``auto``: processes where the
    run can use them, else Ray (:func:`fedpriv.run.layout.run_engine`).
    """

    AUTO = "auto"
    RAY = "ray"
    PROCESSES = "processes"


class RoundFailure(StrEnum):
    """What a run does with a client that raises, times out or sends non-finite values."""

    DROP = "drop"  # a dropout: the round is accounted with the survivors' noise
    STOP = "stop"  # the run ends, status failed, with the client's error


class AuditKind(StrEnum):
    """What ``audit`` inserts into the run."""

    CANARIES = "canaries"


class PartitionKind(StrEnum):
    """How the training records are split over the clients."""

    IID = "iid"
    DIRICHLET = "dirichlet"
    NATURAL = "natural"


@dataclasses.dataclass(frozen=True)
class DatasetPlan:
    """``dataset``: a loader name (:func:`fedpriv.data.load_dataset`), its directory and
    options."""

    name: str
    data_dir: str | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class PartitionPlan:
    """``partition``: the split of the training records over the clients."""

    name: PartitionKind
    alpha: float
    min_size: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", parse_enum(PartitionKind, "partition.name", self.name))
        alpha = check_finite("partition.alpha", self.alpha, "must be a finite number > 0")
        if self.name is PartitionKind.DIRICHLET:
            check(alpha > 0, "partition.alpha", self.alpha, "must be > 0")
        check(self.min_size >= 1, "partition.min_size", self.min_size, "must be >= 1")


@dataclasses.dataclass(frozen=True)
class ModelPlan:
    """``model``: a name of :mod:`fedpriv.models.zoo` and the hidden widths of an MLP."""

    name: str
    hidden: tuple[int, ...] = (256,)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden or (256,)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunPlan:
    """One run, validated (every field as :class:`fedpriv.run.config.RunConfig` documents it).

    Attributes
    ----------
    privacy : PrivacySpec
        The run's privacy spec: bound by the client algorithm (steps, nominal cohort,
        normalizer, ...) and calibrated when ``target_epsilon`` was given. The ledger's events
        and the clients' noise both come from it.
    cohort : CohortSampler
        Who trains each round (``client_sampling`` and its parameters).
    availability : AvailabilityTrace or None
        Simulated device availability (``privacy=ftrl`` only: the enforcement filters by it).
    client, strategy, aggregator : Mapping
        The plug-in groups' nodes (``_target_`` and its constructor's fields).

    Raises
    ------
    ConfigError
        For a value out of range, naming the field (one line).
    """

    seed: int
    num_clients: int
    num_rounds: int
    dataset: DatasetPlan
    partition: PartitionPlan
    model: ModelPlan
    privacy: PrivacySpec
    cohort: CohortSampler
    client: Mapping[str, Any]
    strategy: Mapping[str, Any]
    aggregator: Mapping[str, Any]
    num_workers: int | None
    vmap_clients: bool | None
    device: Device
    num_cpus: float
    num_gpus: float
    ray_init_args: Mapping[str, Any]
    ray_connect_timeout_s: float
    round_timeout: float
    round_failure: RoundFailure
    audit: AuditKind | None
    audit_confidence: float
    progress: bool
    save_model: bool
    plot: bool
    resume: str | None
    availability: AvailabilityTrace | None = None
    engine: Engine = Engine.AUTO

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        check(isinstance(self.seed, int) and self.seed >= 0, "seed", self.seed, "must be >= 0")
        for name, value in (("num_clients", self.num_clients), ("num_rounds", self.num_rounds)):
            check(isinstance(value, int) and value >= 1, name, value, "must be >= 1")
        check(
            self.vmap_clients is None or isinstance(self.vmap_clients, bool),
            "vmap_clients",
            self.vmap_clients,
            "must be true, false or null (auto)",
        )
        set_(self, "device", parse_enum(Device, "device", self.device))
        set_(self, "engine", parse_enum(Engine, "engine", self.engine))
        set_(self, "round_failure", parse_enum(RoundFailure, "round_failure", self.round_failure))
        if self.audit is not None:
            set_(self, "audit", parse_enum(AuditKind, "audit", self.audit))
        _positive("round_timeout", self.round_timeout, " (seconds)")
        _positive("ray_connect_timeout_s", self.ray_connect_timeout_s, " (seconds)")
        _positive("client_resources.num_cpus", self.num_cpus)
        check(
            math.isfinite(self.num_gpus) and self.num_gpus >= 0,
            "client_resources.num_gpus",
            self.num_gpus,
            "must be >= 0",
        )
        check(
            0 < self.audit_confidence < 1,
            "audit_confidence",
            self.audit_confidence,
            "must be in (0, 1)",
        )
        check(
            self.cohort.num_clients == self.num_clients,
            "num_clients",
            self.num_clients,
            f"must equal the cohort sampler's {self.cohort.num_clients}",
        )
        check(
            self.availability is None or self.privacy.enforced_participation() is not None,
            "availability.period",
            None if self.availability is None else self.availability.period,
            "needs a privacy family whose server enforces the participation pattern "
            "(privacy=ftrl): the other analyses assume every sampled client is reachable",
        )

    @property
    def secure_mode(self) -> bool:
        """``privacy.secure_mode``: every random draw from OS entropy."""
        return self.privacy.secure_mode

    def with_privacy(self, privacy: PrivacySpec) -> RunPlan:
        """The plan with another (bound, calibrated) privacy spec."""
        return dataclasses.replace(self, privacy=privacy)

    def to_payload(self) -> str:
        """The plan as a JSON payload for the workers (:mod:`fedpriv.common.payload`)."""
        return payload.dumps(self)

    @staticmethod
    def from_payload(text: str) -> RunPlan:
        """Inverse of :meth:`to_payload`: the same classes, validated again.

        Raises
        ------
        TypeError
            If ``text`` is not a payload of a :class:`RunPlan`.
        """
        return payload.loads(text, RunPlan)

    def data_key(self) -> str:
        """A canonical key of what the clients' data depends on (caches of the partition)."""
        parts = (self.dataset, self.partition, self.num_clients, self.seed)
        return payload.dumps(parts)

    def to_config(self) -> dict[str, Any]:
        """The plan as a config tree (``config_resolved.yaml``: what ``resume=`` reloads): the
        top-level keys, the plug-in nodes, and the privacy spec's config fields with the
        calibrated noise (``target_epsilon`` null, ``calibrated_from_target_epsilon`` set)."""
        cohort = self.cohort
        out: dict[str, Any] = {
            "seed": self.seed,
            "num_clients": self.num_clients,
            "num_rounds": self.num_rounds,
            "num_workers": self.num_workers,
            "vmap_clients": self.vmap_clients,
            "engine": self.engine.value,
            "client_sampling": cohort.client_sampling.value,
            "client_sample_rate": cohort.client_sample_rate,
            "num_sampled_clients": cohort.num_sampled_clients,
            "allocation_window": cohort.allocation_window,
            "rounds_per_client": cohort.rounds_per_client,
            "device": self.device.value,
            "round_timeout": self.round_timeout,
            "round_failure": self.round_failure.value,
            "resume": self.resume,
            "availability": {
                "period": None if self.availability is None else self.availability.period,
                "available_fraction": None
                if self.availability is None
                else self.availability.available_fraction,
            },
            "audit": None if self.audit is None else self.audit.value,
            "audit_confidence": self.audit_confidence,
            "ray_connect_timeout_s": self.ray_connect_timeout_s,
            "progress": self.progress,
            "save_model": self.save_model,
            "plot": self.plot,
            "client_resources": {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus},
            "ray_init_args": dict(self.ray_init_args),
            "dataset": _plain(self.dataset),
            "partition": _plain(self.partition),
            "model": _plain(self.model),
            "privacy": privacy_config(self.privacy),
            "client": dict(self.client),
            "strategy": dict(self.strategy),
            "aggregator": dict(self.aggregator),
        }
        return out


def privacy_config(spec: PrivacySpec) -> dict[str, Any]:
    """The privacy group's node of ``spec``: ``_target_`` and its config fields (the fields the
    run binds left out, except the target a noise was calibrated to)."""
    cls = type(spec)
    node: dict[str, Any] = {"_target_": f"{cls.__module__}.{cls.__qualname__}"}
    skip = set(spec.bound_fields) - {"calibrated_from_target_epsilon"}
    for f in dataclasses.fields(spec):
        if f.init and f.name not in skip:
            node[f.name] = payload.encode(getattr(spec, f.name))
    return node


def _plain(obj: Any) -> Any:
    data = payload.encode(obj)
    return data["fields"] if isinstance(data, dict) and "fields" in data else data


def _positive(field: str, value: float, unit: str = "") -> None:
    x = check_finite(field, value, f"must be a finite number > 0{unit}")
    check(x > 0, field, value, f"must be > 0{unit}")


def sampling_of(node: Mapping[str, Any]) -> CohortSampler:
    """The run's :class:`CohortSampler` from the top-level keys (validated: one line naming the
    field); an absent or null ``client_sampling`` is ``all``."""
    sampling = node.get("client_sampling")
    return CohortSampler(
        num_clients=int(node["num_clients"]),
        client_sampling=ClientSampling.ALL if sampling is None else sampling,
        client_sample_rate=node.get("client_sample_rate"),
        num_sampled_clients=node.get("num_sampled_clients"),
        allocation_window=node.get("allocation_window"),
        rounds_per_client=node.get("rounds_per_client"),
        seed=int(node["seed"]),
    )
