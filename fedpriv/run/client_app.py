"""The Flower ``ClientApp``: receives the global model, runs the client algorithm, replies.

The run's plan travels inside the app as a typed payload (:meth:`RunPlan.to_payload`, shipped
to the Ray actors); each worker decodes it into the same classes, validated again, and builds
the same client algorithm with the same bound privacy spec. A node is either a worker
training the virtual clients its message names (:mod:`fedpriv.run.engine`) or, for SecAgg+, one
client found by its ``partition-id`` (Flower's node config). Each virtual client seeds its
randomness from ``(seed, server_round, partition_id)``, or from OS entropy in ``secure_mode``.

Engine glue, so it lives in the core.
"""

from __future__ import annotations

import traceback
import warnings
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedpriv.common.heap import trim_heap
from fedpriv.common.notices import quiet_known_notices
from fedpriv.common.wire import CONFIG_KEY, METRICS_KEY, MODEL_KEY, UPDATE_KEY
from fedpriv.data.client_data import ClientData
from fedpriv.data.shared import release_pages
from fedpriv.mechanisms.noise import make_generator
from fedpriv.mechanisms.vmap_clients import chunk_size, dense_chain
from fedpriv.run.aggregation import aggregator_class
from fedpriv.run.algorithm import ClientAlgorithm, MessageKind, TrainContext
from fedpriv.run.audit import with_canaries
from fedpriv.run.engine import WorkerReply, asks_sum, named_clients, round_config_of
from fedpriv.run.plan import RunPlan
from fedpriv.run.secagg_codec import SECAGG_MODS
from fedpriv.run.setup import (
    build_algorithm,
    build_model_for,
    partitions,
    resolve_device,
    run_dataset,
)

quiet_known_notices()  # this module is imported by every Ray worker that runs a client


@lru_cache(maxsize=2)
def worker_plan(plan_json: str) -> RunPlan:
    """The run's plan, decoded once per process (validated again)."""
    return RunPlan.from_payload(plan_json)


@lru_cache(maxsize=2)
def _store(plan_json: str) -> tuple[Any, Any]:
    """The run's dataset and partition, built once per process."""
    plan = worker_plan(plan_json)
    return run_dataset(plan), partitions(plan)


def client_data(plan_json: str, partition_id: int) -> ClientData:
    """Client ``partition_id``'s data: its rows copied out of the process's dataset (the
    dataset and the partition are built once per process, never per client or round)."""
    ds, parts = _store(plan_json)
    idx = parts[partition_id]
    x, y = torch.from_numpy(ds.x_train[idx]), torch.from_numpy(ds.y_train[idx])
    x, y = with_canaries(worker_plan(plan_json), partition_id, x, y)  # audit=canaries only
    return ClientData(x, y, partition_id)


@lru_cache(maxsize=4)
def worker_algorithm(plan_json: str) -> ClientAlgorithm:
    """The client algorithm of the plan, built once per process."""
    return build_algorithm(worker_plan(plan_json))


@lru_cache(maxsize=2)
def worker_model(plan_json: str) -> torch.nn.Module:
    """The worker's model, built once per process; each client starts from a fresh load."""
    plan = worker_plan(plan_json)
    return build_model_for(plan).to(resolve_device(plan))


def client_context(
    plan: RunPlan,
    partition_id: int,
    server_round: int,
    device: torch.device,
    round_config: dict[str, float] | None = None,
) -> TrainContext:
    """A virtual client's randomness for a round: numpy and torch generators seeded from
    ``(seed, server_round, partition_id)``, or OS entropy in ``privacy.secure_mode``; the
    round's public parameters from the server (``round_config``)."""
    secure = plan.secure_mode
    seed_seq = None if secure else [plan.seed, server_round, int(partition_id)]
    rng = np.random.default_rng(seed_seq)
    generator = make_generator(int(rng.integers(2**62)), device=device, secure_mode=secure)
    return TrainContext(
        server_round=server_round,
        rng=rng,
        generator=generator,
        device=device,
        round_config=dict(round_config or {}),
    )


def train_client(
    plan: RunPlan,
    algorithm: ClientAlgorithm,
    model: torch.nn.Module,
    data: ClientData,
    server_round: int,
    round_config: dict[str, float] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """One virtual client's round (:func:`client_context`, then ``algorithm.train``); the update
    as CPU numpy arrays. ``model`` holds the global state on the client's device and is
    modified in place."""
    device = next(model.parameters()).device
    ctx = client_context(plan, data.partition_id, server_round, device, round_config)
    update, metrics = algorithm.train(model, data, ctx)
    return as_numpy(update), metrics


def as_numpy(update: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """An update's tensors as contiguous CPU numpy arrays (the wire's format)."""
    return {k: v.detach().cpu().contiguous().numpy() for k, v in update.items()}


def use_vmap(
    plan: RunPlan, algorithm: ClientAlgorithm, model: torch.nn.Module, clients: int
) -> bool:
    """Whether a worker trains its clients together (``vmap_clients`` true or null, the
    algorithm's own ``train_cohort``, >= 2 clients, a dense model: :func:`dense_chain`)."""
    if plan.vmap_clients is False or clients < 2 or not algorithm.trains_cohorts():
        return False
    return dense_chain(model) is not None


def worker_threads(plan: RunPlan) -> int:
    """torch threads of a worker: the whole CPUs of ``client_resources.num_cpus`` (>= 1; 2 or
    more only on Ray, :func:`fedpriv.run.layout.needs_ray`: a forked worker keeps to one)."""
    return max(1, int(plan.num_cpus))


def train_handler(plan_json: str, msg: Message, context: Context) -> Message:
    """One node, one client (``partition-id`` of the node config): train and reply."""
    plan = worker_plan(plan_json)
    torch.set_num_threads(worker_threads(plan))
    partition_id = int(context.node_config["partition-id"])
    server_round = int(str(msg.content.config_records[CONFIG_KEY]["server_round"]))
    data = client_data(plan_json, partition_id)
    model = build_model_for(plan).to(resolve_device(plan))
    model.load_state_dict(msg.content.array_records[MODEL_KEY].to_torch_state_dict())
    algorithm, rc = worker_algorithm(plan_json), round_config_of(msg)
    update, metrics = train_client(plan, algorithm, model, data, server_round, rc)
    content = RecordDict(
        {
            UPDATE_KEY: ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in update.items()}),
            METRICS_KEY: MetricRecord({k: float(v) for k, v in metrics.items()}),
        }
    )
    return Message(content=content, reply_to=msg)


def worker_train_handler(plan_json: str, msg: Message) -> Message:
    """A worker node's round: train every client the message names, reply with stacked rows
    or, when the message asks (:func:`fedpriv.run.engine.asks_sum`), their sum.

    The model is built once per process and the global state decoded once per message; each
    client starts from it (``load_state_dict``) with its own data and generator, exactly as
    :func:`train_handler`. A client that raises is listed in the reply's ``failed`` with its
    error line; the others still reply. Each client's update goes into the reply as it
    finishes, so a summed reply holds one update in memory, not the share's.
    """
    plan = worker_plan(plan_json)
    torch.set_num_threads(worker_threads(plan))
    server_round = int(str(msg.content.config_records[CONFIG_KEY]["server_round"]))
    algorithm = worker_algorithm(plan_json)
    model = worker_model(plan_json)
    start = msg.content.array_records[MODEL_KEY].to_torch_state_dict()
    pids = named_clients(msg) or []
    rc = round_config_of(msg)
    out = WorkerReply(asks_sum(msg))
    done: set[int] = set()
    if use_vmap(plan, algorithm, model, len(pids)):
        done = train_together(plan_json, algorithm, model, start, pids, server_round, rc, out)
    failed: dict[int, str] = {}
    for pid in pids:
        if pid in done:
            continue
        try:
            model.train()
            model.load_state_dict(start)
            data = client_data(plan_json, pid)
            update, m = train_client(plan, algorithm, model, data, server_round, rc)
        except Exception as exc:  # one client's failure is its own, not the worker's
            failed[pid] = client_error(pid, exc)
            continue
        out.add([pid], {k: np.asarray(v)[None] for k, v in update.items()}, [m])
    release_pages(_store(plan_json)[0].x_train)  # rows copied out: unmap the shared set
    reply = out.reply(msg, failed)
    trim_heap()  # the round's freed blocks back to the system (fedpriv.common.heap)
    return reply


def client_error(pid: int, exc: BaseException) -> str:
    """``"client 3: ValueError: boom"`` (first line, at most 300 characters), then a newline
    and the traceback (at most 4000 characters): the run prints the first line, its
    ``errors.log`` keeps the rest."""
    line = " ".join(f"client {pid}: {type(exc).__name__}: {exc}".split())[:300]
    return line + "\n" + traceback.format_exc()[-4000:]


def train_together(
    plan_json: str,
    algorithm: ClientAlgorithm,
    model: torch.nn.Module,
    start: dict[str, torch.Tensor],
    pids: list[int],
    server_round: int,
    round_config: dict[str, float] | None,
    out: WorkerReply,
) -> set[int]:
    """``algorithm.train_cohort`` over ``pids`` in memory-bounded chunks, each chunk's rows
    added to ``out``; returns the clients done. A chunk that raises is left out (its clients
    then train one by one, from fresh generators)."""
    model.load_state_dict(start)
    device = next(model.parameters()).device
    plan = worker_plan(plan_json)
    datas = [client_data(plan_json, pid) for pid in pids]
    size = chunk_size(model, max(len(d) for d in datas))
    done: set[int] = set()
    for lo in range(0, len(pids), size):
        part = datas[lo : lo + size]
        ctxs = [
            client_context(plan, d.partition_id, server_round, device, round_config) for d in part
        ]
        try:
            updates, metrics = algorithm.train_cohort(model, part, ctxs)
        except Exception as exc:  # the per-client path then reports each client's own error
            warnings.warn(f"vmap_clients: chunk trained one by one ({exc})", stacklevel=1)
            continue
        ids = [int(d.partition_id) for d in part]
        out.add(ids, as_numpy(updates), metrics)
        done.update(ids)
    return done


def make_client_app(plan: RunPlan) -> ClientApp:
    """A ``ClientApp`` whose handlers run the plan's client algorithm.

    An algorithm may take over whole messages (:meth:`ClientAlgorithm.message_handler`: the
    check-in clients' query and slot messages). The SecAgg+ client mods are registered when
    the configured aggregator declares ``uses_secagg_mods``.
    """
    secagg = aggregator_class(plan.aggregator).uses_secagg_mods
    app = ClientApp(mods=list(SECAGG_MODS) if secagg else None)
    plan_json = plan.to_payload()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        handler = worker_algorithm(plan_json).message_handler(MessageKind.TRAIN)
        if handler is not None:
            return handler(worker_plan(plan_json), msg, context)
        if named_clients(msg) is not None:
            return worker_train_handler(plan_json, msg)
        return train_handler(plan_json, msg, context)

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        """Query messages go to the algorithm's query handler (e.g. random check-ins)."""
        algorithm = worker_algorithm(plan_json)
        handler = algorithm.message_handler(MessageKind.QUERY)
        if handler is None:
            raise RuntimeError(f"{type(algorithm).__name__} answers no query messages")
        return handler(worker_plan(plan_json), msg, context)

    return app
