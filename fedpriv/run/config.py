"""Structured schema of the Hydra config tree (``conf/``) and its validation.

Hydra checks types against these dataclasses when the config is composed; :func:`validate`
checks ranges and combinations before any training and raises :class:`ConfigError` naming
the field, the value and what is allowed. Client algorithms and strategies are plug-ins
(``_target_``): their own dataclasses validate their fields when instantiated.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from fedpriv.accounting.spec import AccountingSpec
from fedpriv.common.errors import ConfigError, check

DEVICES = ("auto", "cpu", "cuda")

#: What a float field must be, for the message refusing a non-finite value (other float
#: fields anywhere in the composed config get "must be a finite number").
FINITE_RULES = {
    "privacy.noise_multiplier": "must be a finite number >= 0",
    "privacy.target_epsilon": "must be a finite number > 0",
    "privacy.target_delta": "must be a finite number in (0, 1)",
    "privacy.max_grad_norm": "must be a finite number > 0",
    "privacy.sample_rate": "must be a finite number in (0, 1]",
    "privacy.stop_at_epsilon": "must be a finite number > 0",
    "privacy.local_epsilon": "must be a finite number > 0",
    "privacy.local_delta": "must be a finite number in [0, 1)",
    "privacy.clipping_norm": "must be a finite number > 0",
    "privacy.checkin_probability": "must be a finite number in (0, 1]",
    "privacy.count_noise_multiplier": "must be a finite number > 0",
    "round_timeout": "must be a finite number > 0 (seconds)",
    "client_sample_rate": "must be a finite number in (0, 1]",
    "partition.alpha": "must be a finite number > 0",
    "client.lr": "must be a finite number > 0",
    "strategy.server_lr": "must be a finite number > 0",
    "ray_connect_timeout_s": "must be a finite number > 0 (seconds)",
    "audit_confidence": "must be a finite number in (0, 1)",
}


@dataclass
class DatasetConfig:
    name: str = "fashion_mnist_embedded"
    data_dir: Optional[str] = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class PartitionConfig:
    name: str = "iid"  # iid | dirichlet | natural
    alpha: float = 0.5
    min_size: int = 1


@dataclass
class ModelConfig:
    name: str = "tanh_cnn"
    hidden: list[int] = field(default_factory=lambda: [256])


@dataclass
class PrivacyConfig:
    """Privacy parameters shared by the client algorithm and the accountant.

    ``noise_multiplier`` is the noise std of the released SUM over clients per unit of
    sensitivity (σ); each client adds its share σ·C/√num_clients (third paper, Thm 4.7).
    """

    noise_multiplier: Optional[float] = 1.0
    target_epsilon: Optional[float] = None
    target_delta: float = 1e-5
    max_grad_norm: float = 1.0
    sample_rate: float = 0.1
    accountant: str = "pld"
    conversion: str = "default"
    stop_at_epsilon: Optional[float] = None
    honest_but_curious: bool = False
    secure_mode: bool = False
    # random check-ins (second paper): the local randomizer's budget, clip and p0
    local_epsilon: Optional[float] = None
    local_delta: float = 0.0
    clipping_norm: float = 1.0  # also client-level DP-FedAvg's (initial) clip of a whole delta
    checkin_probability: float = 1.0
    # client-level adaptive clipping: noise of the unclipped count (null: fixed clipping)
    count_noise_multiplier: Optional[float] = None
    group_sizes: Optional[list[int]] = None  # null: the algorithm's default


@dataclass
class ClientResources:
    num_cpus: float = 1.0
    num_gpus: float = 0.0


@dataclass
class RunConfig:
    """Top-level schema (``conf/config.yaml``)."""

    seed: int = 0
    num_clients: int = 10
    num_rounds: int = 15
    num_workers: Optional[int] = None
    vmap_clients: Any = None  # true | false | null (checked in validate: bools only)
    client_sampling: str = "all"
    client_sample_rate: Optional[float] = None
    num_sampled_clients: Optional[int] = None
    allocation_window: Optional[int] = None
    rounds_per_client: Optional[int] = None
    device: str = "auto"
    round_timeout: float = 600.0
    progress: bool = True
    save_model: bool = True
    plot: bool = True
    client_resources: ClientResources = field(default_factory=ClientResources)
    ray_init_args: dict[str, Any] = field(default_factory=dict)
    ray_connect_timeout_s: float = 10.0
    round_failure: str = "drop"  # drop | stop (RoundFailure)
    resume: Optional[str] = None  # a run directory to continue in place
    audit: Optional[str] = None  # null | canaries (AuditKind)
    audit_confidence: float = 0.95
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    client: Any = MISSING
    strategy: Any = MISSING
    aggregator: Any = MISSING


def register_schema() -> None:
    """Register :class:`RunConfig` as ``fedpriv_schema`` in Hydra's ConfigStore, and the
    ``${fedpriv_pid:}`` resolver (this process's id: part of the default run directory, so
    that two runs started in the same second never share one)."""
    ConfigStore.instance().store(name="fedpriv_schema", node=RunConfig)
    if not OmegaConf.has_resolver("fedpriv_pid"):
        OmegaConf.register_new_resolver("fedpriv_pid", lambda: str(os.getpid()))


def conf_dir() -> Path:
    """The repository's ``conf/`` directory (the package is installed editable)."""
    return Path(__file__).resolve().parents[2] / "conf"


def validate_privacy(p: DictConfig | PrivacyConfig) -> None:
    """Range checks for the ``privacy`` group.

    Raises
    ------
    ConfigError
        Naming the first offending field.
    """
    sigma, target = p.noise_multiplier, p.target_epsilon
    if (
        getattr(p, "local_epsilon", None) is not None
    ):  # random check-ins: noise set by the local randomizer
        check(
            sigma is None,
            "privacy.noise_multiplier",
            sigma,
            "must be null when privacy.local_epsilon is set (the local randomizer sets the noise)",
        )
    else:
        check(
            sigma is not None or target is not None,
            "privacy.noise_multiplier",
            sigma,
            "and privacy.target_epsilon=None: give one of them",
        )
        check(
            sigma is None or target is None,
            "privacy.noise_multiplier",
            sigma,
            f"and privacy.target_epsilon={target!r}: give exactly one "
            "(set privacy.noise_multiplier=null to calibrate to privacy.target_epsilon)",
        )
    if sigma is not None:
        check(sigma >= 0, "privacy.noise_multiplier", sigma, "must be >= 0")
    if target is not None:
        check(target > 0, "privacy.target_epsilon", target, "must be > 0")
    check(0 < p.target_delta < 1, "privacy.target_delta", p.target_delta, "must be in (0, 1)")
    check(p.max_grad_norm > 0, "privacy.max_grad_norm", p.max_grad_norm, "must be > 0")
    check(0 < p.sample_rate <= 1, "privacy.sample_rate", p.sample_rate, "must be in (0, 1]")
    accounting_spec(p)  # accountant and conversion: closed sets (enums) and their pairing
    if p.stop_at_epsilon is not None:
        check(p.stop_at_epsilon > 0, "privacy.stop_at_epsilon", p.stop_at_epsilon, "must be > 0")


def accounting_spec(p: DictConfig | PrivacyConfig | dict[str, Any]) -> AccountingSpec:
    """The :class:`AccountingSpec` of a ``privacy`` group (accountant, conversion, δ).

    Raises
    ------
    ConfigError
        For an accountant or conversion outside its enum, or Mironov's conversion without RDP.
    """
    values: dict[str, Any] = dict(p) if isinstance(p, (dict, DictConfig)) else vars(p)
    return AccountingSpec.from_privacy(values)


def check_all_finite(node: Any, path: str = "") -> None:
    """Refuse any NaN or infinite float anywhere in the composed config, naming its path.

    Raises
    ------
    ConfigError
        ``privacy.max_grad_norm=inf must be a finite number > 0`` (rule from
        :data:`FINITE_RULES`, else ``must be a finite number``).
    """
    if isinstance(node, dict):
        for key, value in node.items():
            check_all_finite(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            check_all_finite(value, f"{path}[{i}]")
    elif isinstance(node, float) and not math.isfinite(node):
        raise ConfigError(path, node, FINITE_RULES.get(path, "must be a finite number"))


def validate(cfg: DictConfig) -> None:
    """Range checks for the whole run config (types were checked by Hydra's schema).

    Raises
    ------
    ConfigError
        Naming the first offending field, its value and the allowed range.
    """
    check_all_finite(OmegaConf.to_container(cfg, resolve=True))
    check(cfg.seed >= 0, "seed", cfg.seed, "must be >= 0")
    check(cfg.num_clients >= 1, "num_clients", cfg.num_clients, "must be >= 1")
    check(
        cfg.vmap_clients is None or isinstance(cfg.vmap_clients, bool),
        "vmap_clients",
        cfg.vmap_clients,
        "must be true, false or null (auto)",
    )
    check(cfg.num_rounds >= 1, "num_rounds", cfg.num_rounds, "must be >= 1")
    check(cfg.device in DEVICES, "device", cfg.device, f"must be one of {DEVICES}")
    check(cfg.round_timeout > 0, "round_timeout", cfg.round_timeout, "must be > 0 (seconds)")
    check(
        0 < cfg.audit_confidence < 1,
        "audit_confidence",
        cfg.audit_confidence,
        "must be in (0, 1)",
    )
    check(
        cfg.ray_connect_timeout_s > 0,
        "ray_connect_timeout_s",
        cfg.ray_connect_timeout_s,
        "must be > 0 (seconds)",
    )
    check(
        cfg.client_resources.num_cpus > 0,
        "client_resources.num_cpus",
        cfg.client_resources.num_cpus,
        "must be > 0",
    )
    check(
        cfg.client_resources.num_gpus >= 0,
        "client_resources.num_gpus",
        cfg.client_resources.num_gpus,
        "must be >= 0",
    )
    check(
        cfg.partition.name in ("iid", "dirichlet", "natural"),
        "partition.name",
        cfg.partition.name,
        "must be one of ('iid', 'dirichlet', 'natural')",
    )
    if cfg.partition.name == "dirichlet":
        check(cfg.partition.alpha > 0, "partition.alpha", cfg.partition.alpha, "must be > 0")
    check(cfg.partition.min_size >= 1, "partition.min_size", cfg.partition.min_size, "must be >= 1")
    validate_privacy(cfg.privacy)


def to_container(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as plain Python containers (picklable, JSON-able)."""
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
