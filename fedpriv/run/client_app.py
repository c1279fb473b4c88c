"""The Flower ``ClientApp``: receives the global model, runs the client algorithm, replies.

The run's resolved config travels inside the app (it is shipped to the Ray actors), so a
worker that re-imports this module does no argument parsing. A node is either a worker
training the virtual clients its message names (:mod:`fedpriv.run.engine`) or, for SecAgg+, one
client found by its ``partition-id`` (Flower's node config). Each virtual client seeds its
randomness from ``(seed, server_round, partition_id)``, or from OS entropy in ``secure_mode``.

Engine glue, so it lives in the core.
"""

from __future__ import annotations

import json
import traceback
import warnings
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedpriv.common.notices import quiet_known_notices
from fedpriv.common.wire import CONFIG_KEY, METRICS_KEY, MODEL_KEY, UPDATE_KEY
from fedpriv.data.shared import release_pages
from fedpriv.mechanisms.noise import make_generator
from fedpriv.mechanisms.vmap_clients import chunk_size, dense_chain
from fedpriv.run.aggregation import aggregator_class
from fedpriv.run.algorithm import ClientData, TrainContext
from fedpriv.run.audit import with_canaries
from fedpriv.run.engine import named_clients, round_config_of, row_blocks, stacked_reply
from fedpriv.run.setup import (
    build_algorithm,
    build_model_for,
    partitions,
    resolve_device,
    run_dataset,
)

quiet_known_notices()  # this module is imported by every Ray worker that runs a client


@lru_cache(maxsize=2)
def _store(cfg_json: str) -> tuple[Any, Any]:
    """The run's dataset and partition, built once per process."""
    cfg = json.loads(cfg_json)
    return run_dataset(cfg), partitions(cfg)


def _client_data(cfg_json: str, partition_id: int) -> ClientData:
    """Client ``partition_id``'s data: its rows copied out of the process's dataset (the
    dataset and the partition are built once per process, never per client or round)."""
    ds, parts = _store(cfg_json)
    idx = parts[partition_id]
    x, y = torch.from_numpy(ds.x_train[idx]), torch.from_numpy(ds.y_train[idx])
    x, y = with_canaries(json.loads(cfg_json), partition_id, x, y)  # audit=canaries only
    return ClientData(x, y, partition_id)


@lru_cache(maxsize=4)
def _algorithm(cfg_json: str) -> Any:
    return build_algorithm(json.loads(cfg_json))


@lru_cache(maxsize=2)
def _model(cfg_json: str) -> torch.nn.Module:
    """The worker's model, built once per process; each client starts from a fresh load."""
    cfg = json.loads(cfg_json)
    return build_model_for(cfg).to(resolve_device(cfg))


def client_context(
    cfg: dict[str, Any],
    partition_id: int,
    server_round: int,
    device: torch.device,
    round_config: dict[str, float] | None = None,
) -> TrainContext:
    """A virtual client's randomness for a round: numpy and torch generators seeded from
    ``(seed, server_round, partition_id)``, or OS entropy in ``privacy.secure_mode``; the
    round's public parameters from the server (``round_config``)."""
    secure = bool(cfg["privacy"].get("secure_mode"))
    seed_seq = None if secure else [int(cfg["seed"]), server_round, int(partition_id)]
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
    cfg: dict[str, Any],
    algorithm: Any,
    model: torch.nn.Module,
    data: ClientData,
    server_round: int,
    round_config: dict[str, float] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """One virtual client's round (:func:`client_context`, then ``algorithm.train``); the update
    as CPU numpy arrays. ``model`` holds the global state on the client's device and is
    modified in place."""
    device = next(model.parameters()).device
    ctx = client_context(cfg, data.partition_id, server_round, device, round_config)
    update, metrics = algorithm.train(model, data, ctx)
    return as_numpy(update), metrics


def as_numpy(update: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """An update's tensors as contiguous CPU numpy arrays (the wire's format)."""
    return {k: v.detach().cpu().contiguous().numpy() for k, v in update.items()}


def use_vmap(cfg: dict[str, Any], algorithm: Any, model: torch.nn.Module, clients: int) -> bool:
    """Whether a worker trains its clients together (``vmap_clients`` true or null, the
    algorithm's own ``train_cohort``, >= 2 clients, a dense model: :func:`dense_chain`)."""
    mode = cfg.get("vmap_clients")
    if mode is False or clients < 2 or not cohort_is_train(algorithm):
        return False
    return dense_chain(model) is not None


def cohort_is_train(algorithm: Any) -> bool:
    """Whether ``algorithm.train_cohort`` is the vectorized form of ITS ``train``: the class
    defining ``train_cohort`` also defines the ``train`` in use (a subclass that overrides
    ``train``, e.g. to post-process the update, trains one by one)."""
    cls = type(algorithm)
    owner = next((c for c in cls.__mro__ if "train_cohort" in vars(c)), None)
    return owner is not None and getattr(cls, "train", None) is getattr(owner, "train", None)


def train_handler(cfg: dict[str, Any], msg: Message, context: Context) -> Message:
    """One node, one client (``partition-id`` of the node config): train and reply."""
    torch.set_num_threads(1)
    cfg_json = json.dumps(cfg, sort_keys=True)
    partition_id = int(context.node_config["partition-id"])
    server_round = int(str(msg.content.config_records[CONFIG_KEY]["server_round"]))
    data = _client_data(cfg_json, partition_id)
    model = build_model_for(cfg).to(resolve_device(cfg))
    model.load_state_dict(msg.content.array_records[MODEL_KEY].to_torch_state_dict())
    algorithm, rc = _algorithm(cfg_json), round_config_of(msg)
    update, metrics = train_client(cfg, algorithm, model, data, server_round, rc)
    content = RecordDict(
        {
            UPDATE_KEY: ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in update.items()}),
            METRICS_KEY: MetricRecord({k: float(v) for k, v in metrics.items()}),
        }
    )
    return Message(content=content, reply_to=msg)


def worker_train_handler(cfg: dict[str, Any], cfg_json: str, msg: Message) -> Message:
    """A worker node's round: train every client the message names, reply with stacked rows.

    The model is built once per process and the global state decoded once per message; each
    client starts from it (``load_state_dict``) with its own data and generator, exactly as
    :func:`train_handler`. A client that raises is listed in the reply's ``failed`` with its
    error line; the others still reply.
    """
    torch.set_num_threads(1)
    server_round = int(str(msg.content.config_records[CONFIG_KEY]["server_round"]))
    algorithm = _algorithm(cfg_json)
    model = _model(cfg_json)
    start = msg.content.array_records[MODEL_KEY].to_torch_state_dict()
    pids = named_clients(msg) or []
    rc = round_config_of(msg)
    blocks: list[Block] = []
    if use_vmap(cfg, algorithm, model, len(pids)):
        blocks = train_together(cfg, cfg_json, algorithm, model, start, pids, server_round, rc)
    done = {pid for block in blocks for pid in block[0]}
    failed: dict[int, str] = {}
    for pid in pids:
        if pid in done:
            continue
        try:
            model.train()
            model.load_state_dict(start)
            data = _client_data(cfg_json, pid)
            update, m = train_client(cfg, algorithm, model, data, server_round, rc)
        except Exception as exc:  # one client's failure is its own, not the worker's
            failed[pid] = client_error(pid, exc)
            continue
        blocks += row_blocks([pid], [update], [m])
    release_pages(_store(cfg_json)[0].x_train)  # rows copied out: unmap the shared set
    return stacked_reply(msg, blocks, failed)


def client_error(pid: int, exc: BaseException) -> str:
    """``"client 3: ValueError: boom"`` (first line, at most 300 characters), then a newline
    and the traceback (at most 4000 characters): the run prints the first line, its
    ``errors.log`` keeps the rest."""
    line = " ".join(f"client {pid}: {type(exc).__name__}: {exc}".split())[:300]
    return line + "\n" + traceback.format_exc()[-4000:]


#: Clients trained together: their ids, their updates stacked ``(k, ...)``, their metrics.
Block = tuple[list[int], dict[str, np.ndarray], list[dict[str, float]]]


def train_together(
    cfg: dict[str, Any],
    cfg_json: str,
    algorithm: Any,
    model: torch.nn.Module,
    start: dict[str, torch.Tensor],
    pids: list[int],
    server_round: int,
    round_config: dict[str, float] | None = None,
) -> list[Block]:
    """``algorithm.train_cohort`` over ``pids`` in memory-bounded chunks; a chunk that raises
    is left out (its clients then train one by one, from fresh generators)."""
    model.load_state_dict(start)
    device = next(model.parameters()).device
    datas = [_client_data(cfg_json, pid) for pid in pids]
    size = chunk_size(model, max(len(d) for d in datas))
    blocks: list[Block] = []
    for lo in range(0, len(pids), size):
        part = datas[lo : lo + size]
        ctxs = [
            client_context(cfg, d.partition_id, server_round, device, round_config) for d in part
        ]
        try:
            updates, metrics = algorithm.train_cohort(model, part, ctxs)
        except Exception as exc:  # the per-client path then reports each client's own error
            warnings.warn(f"vmap_clients: chunk trained one by one ({exc})", stacklevel=1)
            continue
        blocks.append(([int(d.partition_id) for d in part], as_numpy(updates), metrics))
    return blocks


def make_client_app(cfg: dict[str, Any]) -> ClientApp:
    """A ``ClientApp`` whose ``train`` handler runs the configured client algorithm.

    An algorithm may take over whole messages: ``train_message_handler(cfg, msg, context)``
    for train messages and ``query_handler(cfg, msg, context)`` for query messages. The
    SecAgg+ client mods are registered when the configured aggregator declares
    ``uses_secagg_mods``.
    """
    secagg = bool(getattr(aggregator_class(cfg.get("aggregator")), "uses_secagg_mods", False))
    if secagg:
        from fedpriv.run.secagg_codec import SECAGG_MODS

    app = ClientApp(mods=list(SECAGG_MODS) if secagg else None)

    cfg_json = json.dumps(cfg, sort_keys=True)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        handler = getattr(_algorithm(cfg_json), "train_message_handler", None)
        if handler is not None:
            return handler(cfg, msg, context)
        if named_clients(msg) is not None:
            return worker_train_handler(cfg, cfg_json, msg)
        return train_handler(cfg, msg, context)

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        """Query messages go to the algorithm's ``query_handler`` (e.g. random check-ins)."""
        algorithm = _algorithm(cfg_json)
        handler = getattr(algorithm, "query_handler", None)
        if handler is None:
            raise RuntimeError(f"{type(algorithm).__name__} answers no query messages")
        return handler(cfg, msg, context)

    return app
