"""Builds a run's parts from its resolved config (plain dicts): data, model, algorithm, device.

Used by the server (evaluation, validation) and by every virtual client, which rebuild the
same deterministic partition from ``seed``.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra.utils import instantiate

from fedpriv.common.errors import ConfigError, build_error, check
from fedpriv.data import (
    ArrayDataset,
    load_dataset,
    partition_dirichlet,
    partition_iid,
    partition_natural,
)
from fedpriv.data.partition import PackedPartition
from fedpriv.data.shared import load_shared, share
from fedpriv.models.zoo import build_model
from fedpriv.run.algorithm import ClientAlgorithm


@lru_cache(maxsize=2)
def _dataset(dataset_json: str) -> ArrayDataset:
    shared = load_shared(dataset_json)
    if shared is not None:
        return shared
    d = json.loads(dataset_json)
    return load_dataset(d["name"], d.get("data_dir"), **(d.get("options") or {}))


def run_dataset(cfg: dict[str, Any]) -> ArrayDataset:
    """The run's dataset (cached per process; a large one memory-mapped from the copy the
    driver shared, :mod:`fedpriv.data.shared`)."""
    return _dataset(json.dumps(cfg["dataset"], sort_keys=True))


def share_run_dataset(cfg: dict[str, Any]) -> Path | None:
    """Write the run's (large) dataset for every process to map; this process maps it too.

    Returns the folder to delete when the run ends (``None``: small data, nothing shared).
    """
    key = json.dumps(cfg["dataset"], sort_keys=True)
    folder = share(key, run_dataset(cfg))
    if folder is not None:
        _dataset.cache_clear()
    return folder


@lru_cache(maxsize=2)
def _partitions(key: str) -> PackedPartition:
    cfg = json.loads(key)
    ds = run_dataset(cfg)
    part, n = cfg["partition"], cfg["num_clients"]
    check(
        n <= len(ds.y_train),
        "num_clients",
        n,
        f"must be <= the {len(ds.y_train)} training samples of {ds.name}",
    )
    rng = np.random.default_rng([int(cfg["seed"]), 7919])
    if part["name"] == "iid":
        return PackedPartition(partition_iid(len(ds.y_train), n, rng))
    if part["name"] == "dirichlet":
        return PackedPartition(
            partition_dirichlet(
                ds.y_train, n, float(part["alpha"]), rng, min_size=int(part["min_size"])
            )
        )
    if part["name"] == "natural":
        check(
            ds.groups_train is not None,
            "partition.name",
            "natural",
            f"needs a dataset with natural clients; {ds.name} has none",
        )
        parts = partition_natural(ds.groups_train)  # type: ignore[arg-type]
        check(
            len(parts) == n,
            "num_clients",
            n,
            f"must equal the {len(parts)} natural clients of {ds.name}",
        )
        return PackedPartition(parts)
    raise ConfigError(
        "partition.name", part["name"], "must be one of ('iid', 'dirichlet', 'natural')"
    )


def partitions(cfg: dict[str, Any]) -> PackedPartition:
    """Index arrays of every client's training data (deterministic from ``seed``)."""
    key = json.dumps(
        {k: cfg[k] for k in ("dataset", "partition", "num_clients", "seed")}, sort_keys=True
    )
    return _partitions(key)


def client_partition(cfg: dict[str, Any], partition_id: int) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` of client ``partition_id``: ``(n, *input_shape)`` float32, ``(n,)`` int64."""
    ds = run_dataset(cfg)
    idx = partitions(cfg)[partition_id]
    return ds.x_train[idx], ds.y_train[idx]


def build_model_for(cfg: dict[str, Any]) -> torch.nn.Module:
    """The configured model, initialised deterministically from ``seed``."""
    ds = run_dataset(cfg)
    torch.manual_seed(int(cfg["seed"]))
    m = cfg["model"]
    return build_model(
        m["name"], tuple(ds.input_shape), ds.num_classes, hidden=tuple(m.get("hidden") or (256,))
    )


def build_algorithm(cfg: dict[str, Any]) -> Any:
    """Instantiate the ``client`` group's ``_target_`` with the run's privacy and the number of
    clients whose noise a round's sum holds: ``num_clients``, or the sampled cohort's nominal
    size (:attr:`fedpriv.mechanisms.client_sampling.CohortSampler.nominal_size`).

    Raises
    ------
    ConfigError
        If the target cannot be imported or rejects its fields.
    """
    target = cfg["client"].get("_target_")
    from fedpriv.run.layout import cohort_sampler

    cohort = cohort_sampler(cfg)
    try:
        algo = instantiate(
            cfg["client"],
            privacy=dict(cfg["privacy"]),
            num_clients=cohort.nominal_size,
            _convert_="all",
        )
    except ConfigError as exc:
        if exc.field != "num_clients" or cohort.nominal_size == cohort.num_clients:
            raise
        field = "client_sample_rate" if cohort.varies else "num_sampled_clients"
        given = cohort.client_sample_rate if cohort.varies else cohort.num_sampled_clients
        raise ConfigError(
            field,
            given,
            f"gives a nominal cohort of {cohort.nominal_size} client(s), and the client "
            f"algorithm refuses it: {exc.allowed}",
        ) from None
    except Exception as exc:  # Hydra wraps import and constructor errors
        raise build_error("client", cfg["client"], exc) from None
    check(
        isinstance(algo, ClientAlgorithm),
        "client._target_",
        target,
        "must be a fedpriv.run.algorithm.ClientAlgorithm subclass",
    )
    groups = cfg["privacy"].get("group_sizes")
    check(
        groups is None or type(algo).supports_group_privacy,
        "privacy.group_sizes",
        groups,
        f"must be null: {type(algo).__name__} computes no group privacy "
        "(only batch-clipping clients do)",
    )
    return algo.for_run(cfg)


def resolve_device(cfg: dict[str, Any]) -> torch.device:
    """``cuda`` if configured (``device`` auto/cuda with ``client_resources.num_gpus > 0``) and
    present, else ``cpu``."""
    want, gpus = cfg.get("device", "auto"), float(cfg["client_resources"]["num_gpus"])
    if want == "cuda" or (want == "auto" and gpus > 0):
        check(
            torch.cuda.is_available(),
            "device",
            want,
            "asks for CUDA but no GPU is visible (use device=cpu)",
        )
        return torch.device("cuda")
    return torch.device("cpu")
