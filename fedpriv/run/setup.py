"""Builds a run's parts from its plan: data, partition, model, client algorithm, device.

Used by the server (evaluation, validation) and by every virtual client, which rebuild the
same deterministic partition from ``seed``.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra.utils import instantiate

from fedpriv.common import payload
from fedpriv.common.errors import ConfigError, build_error, check
from fedpriv.common.targets import target_class
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
from fedpriv.run.plan import DatasetPlan, Device, PartitionKind, PartitionPlan, RunPlan


@lru_cache(maxsize=2)
def _dataset(dataset_json: str) -> ArrayDataset:
    shared = load_shared(dataset_json)
    if shared is not None:
        return shared
    d = payload.loads(dataset_json, DatasetPlan)
    return load_dataset(d.name, d.data_dir, **dict(d.options))


def run_dataset(plan: RunPlan) -> ArrayDataset:
    """The run's dataset (cached per process; a large one memory-mapped from the copy the
    driver shared, :mod:`fedpriv.data.shared`)."""
    return _dataset(payload.dumps(plan.dataset))


def share_run_dataset(plan: RunPlan) -> Path | None:
    """Write the run's (large) dataset for every process to map; this process maps it too.

    Returns the folder to delete when the run ends (``None``: small data, nothing shared).
    """
    key = payload.dumps(plan.dataset)
    folder = share(key, run_dataset(plan))
    if folder is not None:
        _dataset.cache_clear()
    return folder


@lru_cache(maxsize=2)
def _partitions(dataset_json: str, part_json: str, n: int, seed: int) -> PackedPartition:
    ds = _dataset(dataset_json)
    part = payload.loads(part_json, PartitionPlan)
    check(
        n <= len(ds.y_train),
        "num_clients",
        n,
        f"must be <= the {len(ds.y_train)} training samples of {ds.name}",
    )
    rng = np.random.default_rng([seed, 7919])
    if part.name is PartitionKind.IID:
        return PackedPartition(partition_iid(len(ds.y_train), n, rng))
    if part.name is PartitionKind.DIRICHLET:
        return PackedPartition(
            partition_dirichlet(ds.y_train, n, part.alpha, rng, min_size=part.min_size)
        )
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


def partitions(plan: RunPlan) -> PackedPartition:
    """Index arrays of every client's training data (deterministic from ``seed``)."""
    return _partitions(
        payload.dumps(plan.dataset), payload.dumps(plan.partition), plan.num_clients, plan.seed
    )


def client_partition(plan: RunPlan, partition_id: int) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` of client ``partition_id``: ``(n, *input_shape)`` float32, ``(n,)`` int64."""
    ds = run_dataset(plan)
    idx = partitions(plan)[partition_id]
    return ds.x_train[idx], ds.y_train[idx]


def build_model_for(plan: RunPlan) -> torch.nn.Module:
    """The configured model, initialised deterministically from ``seed``."""
    ds = run_dataset(plan)
    torch.manual_seed(plan.seed)
    return build_model(
        plan.model.name, tuple(ds.input_shape), ds.num_classes, hidden=plan.model.hidden
    )


def algorithm_class(node: Mapping[str, Any]) -> type[ClientAlgorithm]:
    """The :class:`ClientAlgorithm` class the ``client`` node names (ConfigError otherwise)."""
    return target_class(node, "client", ClientAlgorithm)


def build_algorithm(plan: RunPlan) -> ClientAlgorithm:
    """The ``client`` group's algorithm with the run's privacy spec, bound to the run
    (:meth:`ClientAlgorithm.for_run`); the server and every worker build it the same way.

    Raises
    ------
    ConfigError
        If the target cannot be imported, rejects its fields or the privacy spec's family.
    """
    cls = algorithm_class(plan.client)
    try:
        factory = instantiate(dict(plan.client), _partial_=True, _convert_="all")
        algorithm = factory(privacy=plan.privacy)
    except ConfigError:
        raise
    except Exception as exc:  # Hydra wraps import and constructor errors
        raise build_error("client", plan.client, exc) from None
    check(isinstance(algorithm, cls), "client._target_", plan.client.get("_target_"), "failed")
    try:
        return algorithm.for_run(plan)
    except ConfigError as exc:
        raise nominal_cohort_error(plan, exc) from None


def nominal_cohort_error(plan: RunPlan, exc: ConfigError) -> ConfigError:
    """``exc`` about ``num_clients`` restated for the sampled cohort that set the nominal size
    (``client_sample_rate`` or ``num_sampled_clients``); other errors as they are."""
    cohort = plan.cohort
    if exc.field != "num_clients" or cohort.nominal_size == cohort.num_clients:
        return exc
    field = "client_sample_rate" if cohort.varies else "num_sampled_clients"
    given = cohort.client_sample_rate if cohort.varies else cohort.num_sampled_clients
    return ConfigError(
        field,
        given,
        f"gives a nominal cohort of {cohort.nominal_size} client(s), and the client "
        f"algorithm refuses it: {exc.allowed}",
    )


def resolve_device(plan: RunPlan) -> torch.device:
    """``cuda`` if configured (``device`` auto/cuda with ``client_resources.num_gpus > 0``) and
    present, else ``cpu``."""
    want = plan.device
    if want is Device.CUDA or (want is Device.AUTO and plan.num_gpus > 0):
        why = "" if want is Device.CUDA else f" (client_resources.num_gpus={plan.num_gpus:g})"
        check(
            torch.cuda.is_available(),
            "device",
            want.value,
            f"asks for CUDA{why} but no GPU is visible (use device=cpu, or "
            "client_resources.num_gpus=0)",
        )
        return torch.device("cuda")
    return torch.device("cpu")
