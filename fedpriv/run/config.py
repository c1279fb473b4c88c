"""The structured schema of the Hydra config tree (``conf/``): the ONE place of every default.

``conf/config.yaml`` only picks the default option of each group and Hydra's settings; the
top-level keys' defaults are :class:`RunConfig`'s; each ``conf/privacy/<family>.yaml`` extends
the schema that :func:`~fedpriv.accounting.core.privacy_spec.config_schema` makes of its spec (the
spec's defaults); the ``client``, ``strategy`` and ``aggregator`` options name a class whose
constructor defaults apply (``tests/test_config_defaults.py`` fails if a yaml restates one
with another value). Hydra checks types when the config is composed; ranges and combinations
are checked when the run is planned (:mod:`fedpriv.run.prepare`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields, make_dataclass
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from hydra.utils import get_class
from omegaconf import MISSING, DictConfig, OmegaConf

from fedpriv.accounting.core.privacy_spec import PrivacySpec, config_schema
from fedpriv.common.errors import ConfigError
from fedpriv.common.schema import dataclass_schema
from fedpriv.run.algorithm import ClientAlgorithm

#: Config groups whose options name a class (``_target_``): each option extends the schema of
#: its class (:func:`option_schema`), so the class's defaults are the only ones.
CLASS_GROUPS = ("privacy", "client", "strategy", "aggregator")

#: What a top-level float field must be, for the message refusing a non-finite value (the
#: privacy spec refuses its own fields; other floats get "must be a finite number").
FINITE_RULES = {
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
    """``dataset``: ``name`` of a loader (``fashion_mnist_embedded``, ``fashion_mnist``,
    ``mnist``, ``adult``, ``acs_income``, ``cifar10``, ``fashion_mnist_hf``), the directory of
    its files (``data_dir``) and loader ``options``."""

    name: str = MISSING
    data_dir: Optional[str] = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class PartitionConfig:
    """``partition``: ``iid``, ``dirichlet`` (concentration ``alpha`` > 0) or ``natural`` (one
    client per natural group of the data, e.g. a US state); ``min_size`` records at least."""

    name: str = MISSING
    alpha: float = 0.5
    min_size: int = 1


@dataclass
class ModelConfig:
    """``model``: ``tanh_cnn``, ``mlp`` (``hidden`` widths), ``logistic``, or for CIFAR-10
    ``cifar_cnn`` and ``wrn16_4`` (GroupNorm, weight standardization)."""

    name: str = MISSING
    hidden: list[int] = field(default_factory=lambda: [256])


@dataclass
class ClientResources:
    """Ray resources of one client actor: CPUs (> 0) and GPUs (>= 0, fractions share one)."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0


@dataclass
class AvailabilityConfig:
    """A simulated diurnal device availability (``period`` rounds a day, each client available
    ``available_fraction`` of it on average; null: every client always available). Only with a
    privacy family whose server enforces the participation pattern (``privacy=ftrl``)."""

    period: Optional[int] = None
    available_fraction: Optional[float] = None


@dataclass
class RunConfig:
    """Top-level keys of a run (the defaults of ``fedpriv`` without arguments).

    Attributes
    ----------
    seed : int
        Every random draw of a seeded run is a function of it, the round and the client.
    num_clients : int
        Registered clients (ids ``0..num_clients-1``), >= 1.
    num_rounds : int
        Server rounds, >= 1.
    num_workers : int or null
        Flower nodes, each training many virtual clients (null: one per client actor).
    vmap_clients : bool or null
        Train a worker's clients together, batched (null: auto, on dense models).
    engine : str
        auto | processes (forked here, no Ray) | ray (cluster, SecAgg+, GPUs, 2+ CPU clients).
    client_sampling : str
        all | poisson (client_sample_rate) | fixed_size (num_sampled_clients) | random_allocation.
    client_sample_rate : float or null
        Each client's probability of joining a round's cohort (client_sampling=poisson).
    num_sampled_clients : int or null
        Clients per round, drawn without replacement (client_sampling=fixed_size).
    allocation_window : int or null
        Rounds per epoch t of random allocation (client_sampling=random_allocation).
    rounds_per_client : int or null
        Rounds k of each epoch a client takes part in (client_sampling=random_allocation).
    device : str
        auto | cpu | cuda (auto: CUDA when client_resources.num_gpus > 0).
    round_timeout : float
        Seconds a round waits for replies (the first round 120 s more: Ray starts then).
    progress : bool
        Show the progress bar.
    save_model : bool
        Write the final model to model.npz.
    plot : bool
        Write curves.png (accuracy and ε against the round).
    client_resources : ClientResources
        Ray resources of one client actor (num_cpus, num_gpus).
    availability : AvailabilityConfig
        Simulated device availability (period, available_fraction); privacy=ftrl only.
    ray_init_args : dict
        Passed to ray.init (null values left out); address joins an existing cluster.
    ray_connect_timeout_s : float
        Seconds to reach ray_init_args.address before giving up.
    round_failure : str
        A client that raises, times out or sends NaN: drop (accounted) | stop (run fails).
    resume : str or null
        A run directory to continue in place.
    audit : str or null
        canaries: an empirical lower bound on ε beside the accounted one.
    audit_confidence : float
        Confidence level of the audit's lower bound, in (0, 1).
    dataset, partition, model : group
        The data set, its split over the clients, the model.
    privacy, client, strategy, aggregator : group
        The privacy family's spec, the client algorithm, the server strategy, the aggregator.
    """

    seed: int = 0
    num_clients: int = 10
    num_rounds: int = 20
    num_workers: Optional[int] = None
    vmap_clients: Any = None  # true | false | null: checked by the plan (no coercion of 2)
    engine: str = "auto"
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
    availability: AvailabilityConfig = field(default_factory=AvailabilityConfig)
    ray_init_args: dict[str, Any] = field(
        default_factory=lambda: {"num_cpus": None, "address": None}
    )
    ray_connect_timeout_s: float = 10.0
    round_failure: str = "drop"
    resume: Optional[str] = None
    audit: Optional[str] = None
    audit_confidence: float = 0.95
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    privacy: Any = MISSING
    client: Any = MISSING
    strategy: Any = MISSING
    aggregator: Any = MISSING


def option_schema(cls: type) -> type:
    """The structured config of a class-group option: the class's configurable fields (a
    privacy spec's unbound fields; a client algorithm's fields but its spec and the fields the
    run binds, and ``_recursive_: false`` when it keeps nested ``_target_`` nodes as data)
    with the class's defaults."""
    if issubclass(cls, PrivacySpec):
        return config_schema(cls)
    if not issubclass(cls, ClientAlgorithm):
        return dataclass_schema(cls)
    schema = dataclass_schema(cls, ("privacy", *cls.bound_fields))
    if cls.recursive_config:
        return schema
    flag = ("_recursive_", bool, field(default=False))  # nested _target_ nodes stay data
    return make_dataclass(schema.__name__, [flag], bases=(schema,))


def option_target(path: Path) -> str:
    """The ``_target_`` a group option's yaml names.

    Raises
    ------
    ConfigError
        If the file names none.
    """
    plain = OmegaConf.to_container(OmegaConf.load(path))
    if not isinstance(plain, dict) or "_target_" not in plain:
        raise ConfigError(str(path), None, "must name its class with _target_")
    return str(plain["_target_"])  # "???": a slot for the user's own class


def register_schema(conf: Path | None = None) -> None:
    """Register :class:`RunConfig` as ``fedpriv_schema``, and for every option of the class
    groups (:data:`CLASS_GROUPS`) in ``conf`` (default: :func:`conf_dir`) its class's schema as
    ``<group>/<option>_schema``, in Hydra's ConfigStore; and the ``${fedpriv_pid:}`` resolver
    (this process's id: part of the default run directory, so that two runs started in the
    same second never share one)."""
    conf = conf or conf_dir()
    if conf in _REGISTERED:
        return
    store = ConfigStore.instance()
    store.store(name="fedpriv_schema", node=RunConfig)
    for group in CLASS_GROUPS:
        for path in sorted((conf / group).glob("*.yaml")):
            target = option_target(path)
            if target == "???":  # custom.yaml: the user names the class
                continue
            schema = option_schema(get_class(target))
            store.store(group=group, name=path.stem + SCHEMA_SUFFIX, node=schema)
    if not OmegaConf.has_resolver("fedpriv_pid"):
        OmegaConf.register_new_resolver("fedpriv_pid", lambda: str(os.getpid()))
    _REGISTERED.add(conf)


#: The conf directories whose schemas are in the ConfigStore (registered once per process).
_REGISTERED: set[Path] = set()

#: The name ending of the schema nodes :func:`register_schema` stores in a class group.
SCHEMA_SUFFIX = "_schema"


def is_schema_option(name: str) -> bool:
    """Whether ``name`` is one of the internal schema nodes of a class group (``dpsgd_schema``):
    the option yamls extend them; they are no options of their own."""
    return name.endswith(SCHEMA_SUFFIX)


def group_options(group: str, conf: Path | None = None) -> list[str]:
    """The options of config group ``group``: its yaml files in ``conf`` (default
    :func:`conf_dir`), sorted."""
    return sorted(path.stem for path in ((conf or conf_dir()) / group).glob("*.yaml"))


def check_option(group: str, option: Any) -> None:
    """Refuse an internal schema node chosen as the option of a class group
    (``client=dpsgd_schema``).

    Raises
    ------
    ConfigError
        ``client='dpsgd_schema' is an internal schema, not an option: choose one of ...``.
    """
    if not (group in CLASS_GROUPS and isinstance(option, str) and is_schema_option(option)):
        return
    options = group_options(group)
    if option not in options:  # a yaml of that name is a real option
        raise ConfigError(
            group,
            option,
            "is an internal schema, not an option: choose one of " + ", ".join(options),
        )


def conf_dir() -> Path:
    """The repository's ``conf/`` directory (the package is installed editable)."""
    return Path(__file__).resolve().parents[2] / "conf"


def compose_config(overrides: list[str]) -> DictConfig:
    """The run config of ``overrides`` as ``fedpriv`` composes it (for scripts and tests)."""
    from hydra import compose, initialize_config_dir

    register_schema()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def check_all_finite(node: Any, path: str = "") -> None:
    """Refuse any NaN or infinite float anywhere in the composed config, naming its path (the
    ``privacy`` node is its spec's to check: its messages say the allowed range).

    Raises
    ------
    ConfigError
        ``round_timeout=inf must be a finite number > 0 (seconds)`` (rule from
        :data:`FINITE_RULES`, else ``must be a finite number``).
    """
    if isinstance(node, dict):
        for key, value in node.items():
            if not path and key == "privacy":
                continue
            check_all_finite(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            check_all_finite(value, f"{path}[{i}]")
    elif isinstance(node, float) and not math.isfinite(node):
        raise ConfigError(path, node, FINITE_RULES.get(path, "must be a finite number"))


def check_known_keys(cfg: DictConfig) -> None:
    """Refuse a key outside the schema (``+foo=1`` adds one that Hydra would keep): top-level
    keys and the keys of the typed groups (``dataset``, ``partition``, ``model``,
    ``client_resources``, ``privacy``).

    Raises
    ------
    ConfigError
        ``foo=1 is not a fedpriv setting: ...``.
    """
    typed = {
        "": RunConfig,
        "dataset": DatasetConfig,
        "partition": PartitionConfig,
        "model": ModelConfig,
        "client_resources": ClientResources,
    }
    for where, schema in typed.items():
        node = cfg if not where else cfg.get(where)
        if not isinstance(node, DictConfig):
            continue
        known = {f.name for f in fields(schema)} | {"hydra"}
        for key in node.keys():
            if key not in known:
                name = f"{where}.{key!s}" if where else str(key)
                raise ConfigError(
                    name,
                    OmegaConf.to_container(node)[key] if OmegaConf.is_config(node) else None,  # type: ignore[index]
                    f"is not a fedpriv setting (known{' in ' + where if where else ''}: "
                    + ", ".join(sorted(known - {"hydra"}))
                    + ")",
                )
    check_privacy_keys(cfg.get("privacy"))


def check_privacy_keys(node: Any) -> None:
    """Refuse a key the privacy family's spec does not take (``+privacy.foo=1``).

    Raises
    ------
    ConfigError
        :func:`unknown_privacy_key`'s line.
    """
    if not isinstance(node, DictConfig):
        return
    for key in node.keys():
        error = unknown_privacy_key(node, str(key), node.get(key))
        if error is not None:
            raise error


def unknown_privacy_key(node: Any, key: str, value: Any) -> ConfigError | None:
    """The refusal of ``privacy.<key>=value`` when the spec that the privacy ``node`` names
    does not take ``key`` (``privacy.noise_multiplier=1.0 is not a setting of privacy=checkin
    (its keys: ...)``); ``None`` when it does, or the node names no spec."""
    if not isinstance(node, DictConfig):
        return None
    try:
        family = get_class(str(node.get("_target_", "")))
    except Exception:  # an unknown target is reported when the spec is built
        return None
    if not (isinstance(family, type) and issubclass(family, PrivacySpec)):
        return None
    known = {f.name for f in fields(config_schema(family))}
    if key in known or key == "calibrated_from_target_epsilon":
        return None
    return ConfigError(
        f"privacy.{key!s}",
        value,
        f"is not a setting of privacy={family.family} (its keys: "
        + ", ".join(sorted(known - {"_target_"}))
        + ")",
    )


def to_container(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as plain Python containers (picklable, JSON-able)."""
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
