"""Virtual clients on worker nodes: the message layout between the server and the workers.

A Flower node is a WORKER that trains many virtual clients per round. The server sends each
worker one train message: the global model once and ``clients``, the ids of the virtual
clients it is to train (a contiguous share of the round's sorted cohort). The worker trains
each of them exactly as a node of its own would (its own data, its own generator seeded by
``(seed, server_round, client id)``, the same algorithm) and replies with the clients' updates
STACKED: every array of the update record has a leading axis over the clients that succeeded,
in the order of ``clients`` in the reply's config record; clients that raised are listed in
``failed`` with their error line. The aggregator unpacks the rows (:func:`client_rows`) and
treats each as one client's reply; the strategy never sees one.

Flower's SecAgg+ keeps one node per client (its masks are per node): with an aggregator that
declares ``uses_secagg_mods`` every message names no clients and node ``i`` is client ``i``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)

from fedpriv.common.wire import (
    CLIENTS_KEY,
    CONFIG_KEY,
    METRICS_KEY,
    MODEL_KEY,
    ROUND_CONFIG_KEY,
    UPDATE_KEY,
)


def numpy_state(state: dict[str, np.ndarray]) -> dict[str, Any]:
    """A ``{name: tensor}`` view of ``state`` accepted by ``ArrayRecord`` (zero-copy)."""
    import torch

    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}


def split_cohort(cohort: Sequence[int], num_workers: int) -> list[list[int]]:
    """The sorted cohort cut into at most ``num_workers`` contiguous non-empty near-equal shares."""
    ids = sorted(int(c) for c in cohort)
    shares = np.array_split(np.asarray(ids, dtype=np.int64), max(1, min(num_workers, len(ids))))
    return [s.tolist() for s in shares if len(s)]


def worker_messages(
    node_ids: Sequence[int],
    cohort: Sequence[int],
    state: dict[str, np.ndarray],
    server_round: int,
    round_config: Mapping[str, float] | None = None,
) -> list[Message]:
    """One TRAIN message per worker (the first ``len(shares)`` of ``node_ids``): model + clients
    (+ the round's public parameters, ``round_config``)."""
    arrays = ArrayRecord(numpy_state(state))
    base = _round_entries(server_round, round_config)
    return [
        _train_message(nid, arrays, {**base, CLIENTS_KEY: share})
        for nid, share in zip(node_ids, split_cohort(cohort, len(node_ids)))
    ]


def node_messages(
    node_ids: Sequence[int],
    state: dict[str, np.ndarray],
    server_round: int,
    round_config: Mapping[str, float] | None = None,
) -> list[Message]:
    """One TRAIN message per node (node-per-client layout): the global model and the round."""
    arrays = ArrayRecord(numpy_state(state))
    base = _round_entries(server_round, round_config)
    return [_train_message(nid, arrays, base) for nid in node_ids]


def _round_entries(server_round: int, round_config: Mapping[str, float] | None) -> dict[str, Any]:
    entries: dict[str, Any] = {"server_round": int(server_round)}
    if round_config:
        entries[ROUND_CONFIG_KEY] = json.dumps({k: float(v) for k, v in round_config.items()})
    return entries


def round_config_of(msg: Message) -> dict[str, float]:
    """The public round parameters a train message carries (``{}`` if none)."""
    config = msg.content.config_records.get(CONFIG_KEY)
    if config is None or ROUND_CONFIG_KEY not in config:
        return {}
    return {str(k): float(v) for k, v in json.loads(str(config[ROUND_CONFIG_KEY])).items()}


def _train_message(nid: int, arrays: ArrayRecord, config: dict[str, Any]) -> Message:
    """A TRAIN message to node ``nid``: the shared model record and its config record."""
    return Message(
        content=RecordDict({MODEL_KEY: arrays, CONFIG_KEY: ConfigRecord(config)}),
        dst_node_id=int(nid),
        message_type=MessageType.TRAIN,
        group_id=str(config["server_round"]),
    )


def named_clients(msg: Message) -> list[int] | None:
    """The virtual client ids a message names (``None``: a node-per-client message)."""
    config = msg.content.config_records.get(CONFIG_KEY)
    if config is None or CLIENTS_KEY not in config:
        return None
    return [int(c) for c in config[CLIENTS_KEY]]  # type: ignore[union-attr]


def clients_in(messages: Sequence[Message]) -> int:
    """How many clients a round's messages ask to train (1 per node-per-client message)."""
    return sum(len(c) if (c := named_clients(m)) is not None else 1 for m in messages)


def row_blocks(
    clients: Sequence[int],
    updates: Sequence[dict[str, np.ndarray]],
    metrics: Sequence[dict[str, float]],
) -> list[tuple[list[int], dict[str, np.ndarray], list[dict[str, float]]]]:
    """One :func:`stacked_reply` block per client trained alone (its update as one row)."""
    return [
        ([int(c)], {k: np.asarray(v)[None] for k, v in u.items()}, [m])
        for c, u, m in zip(clients, updates, metrics, strict=True)
    ]


def stacked_reply(
    msg: Message,
    blocks: Sequence[tuple[list[int], dict[str, np.ndarray], list[dict[str, float]]]],
    failed: dict[int, str],
) -> Message:
    """A worker's reply: the clients that succeeded, their updates stacked in that order.

    ``blocks``: ``(client ids, {name: (k, *shape) rows}, [metrics per client])`` per group of
    clients trained together (one row each for clients trained alone).
    """
    clients = [c for ids, _, _ in blocks for c in ids]
    metrics = [m for _, _, ms in blocks for m in ms]
    arrays = (
        {k: Array(np.concatenate([rows[k] for _, rows, _ in blocks])) for k in blocks[0][1]}
        if blocks
        else {}
    )
    content = RecordDict(
        {
            UPDATE_KEY: ArrayRecord(arrays),
            METRICS_KEY: MetricRecord(
                {k: [float(m[k]) for m in metrics] for k in metrics[0]} if metrics else {}
            ),
            CONFIG_KEY: ConfigRecord(
                {CLIENTS_KEY: clients, "failed": list(failed), "errors": list(failed.values())}
            ),
        }
    )
    return Message(content=content, reply_to=msg)


@dataclass
class ClientRows:
    """One reply unpacked: per-client update rows, metrics and errors.

    ``arrays[name]`` has shape ``(len(ids), *param_shape)``; ``ids[i]`` is the client of row
    ``i`` (``-1`` for a node-per-client reply); ``metrics[name]`` has shape ``(len(ids),)``;
    ``errors`` maps the worker's failed client ids to their error line.
    """

    ids: list[int]
    arrays: dict[str, np.ndarray]
    metrics: dict[str, np.ndarray]
    errors: dict[int, str]

    def finite(self) -> np.ndarray:
        """Boolean mask, shape ``(len(ids),)``: rows whose every value is finite."""
        ok = np.ones(len(self.ids), dtype=bool)
        for arr in self.arrays.values():
            if not np.issubdtype(arr.dtype, np.integer):
                ok &= np.isfinite(arr.reshape(len(self.ids), -1)).all(axis=1)
        return ok


def client_rows(reply: Message) -> ClientRows:
    """Unpack a successful train reply (stacked worker reply or one node-per-client reply)."""
    record = reply.content.array_records.get(UPDATE_KEY, ArrayRecord({}))
    arrays = dict(zip(record.keys(), record.to_numpy_ndarrays(keep_input=True), strict=True))
    metric_rec = reply.content.metric_records.get(METRICS_KEY, MetricRecord({}))
    config = reply.content.config_records.get(CONFIG_KEY)
    if config is None or CLIENTS_KEY not in config:
        metrics = {
            k: np.array([float(v)]) for k, v in metric_rec.items() if isinstance(v, (int, float))
        }
        return ClientRows([-1], {k: a[None] for k, a in arrays.items()}, metrics, {})
    ids = [int(c) for c in config[CLIENTS_KEY]]  # type: ignore[union-attr]
    metrics = {k: np.asarray(v, dtype=np.float64) for k, v in metric_rec.items()}
    failed = [int(c) for c in config.get("failed", [])]  # type: ignore[union-attr]
    errors = [str(e) for e in config.get("errors", [])]  # type: ignore[union-attr]
    return ClientRows(ids, arrays, metrics, dict(zip(failed, errors)))
