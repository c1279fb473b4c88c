"""Client side of SecAgg+: one mod that lets the same ``@app.train()`` handler serve both the
ideal aggregator and :class:`strategies.secaggplus.SecAggPlusAggregator`.

Register it on the ClientApp: ``ClientApp(mods=SECAGG_MODS)``. A train message without
SecAgg+ configs goes straight to the handler. A SecAgg+ message runs Flower's
``secaggplus_mod``; in its masked-vector stage the adapter unpacks the original Message-API
content from the legacy ``FitIns``, calls the handler, and turns its reply (an ``update``
ArrayRecord of integers in ``[0, 2**bits)`` and a ``metrics`` MetricRecord) into the legacy
``FitRes`` that ``secaggplus_mod`` masks: the integers split into limbs, weight 1, and the
update's layout (names and shapes, public) in the metrics.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable, Mod
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.compat.common import recorddict_compat as compat

from fedpriv.wire import METRICS_KEY, UPDATE_KEY
from strategies.secaggplus import (
    BITS_KEY,
    CONTENT_KEY,
    LAYOUT_KEY,
    LIMB_KEY,
    split_limbs,
    unpack_content,
)

FITINS_CONFIG = "fitins.config"


def flatten_update(update: ArrayRecord, bits: int) -> tuple[np.ndarray, list[list[Any]]]:
    """The update's arrays concatenated to int64 ``(D,)`` and their layout ``[[key, shape]]``.

    Raises
    ------
    TypeError
        If an array is not of an integer dtype.
    ValueError
        If a value is outside ``[0, 2**bits)``.
    """
    flats, layout = [], []
    for key, arr in zip(update.keys(), update.to_numpy_ndarrays(keep_input=True), strict=True):
        if not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"SecAgg+ sums integers only: update[{key!r}] has dtype {arr.dtype}")
        flats.append(arr.astype(np.int64).reshape(-1))
        layout.append([key, list(arr.shape)])
    flat = np.concatenate(flats) if flats else np.zeros(0, dtype=np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= (1 << bits)):
        raise ValueError(
            f"SecAgg+ update values must be in [0, 2**{bits}); got [{flat.min()}, {flat.max()}]"
        )
    return flat, layout


def _legacy_reply(reply: Message, bits: int, limb_bits: int) -> RecordDict:
    """The handler's Message-API reply as a legacy ``FitRes`` RecordDict for secaggplus_mod."""
    flat, layout = flatten_update(reply.content.array_records[UPDATE_KEY], bits)
    metrics: dict[str, Any] = {}
    if METRICS_KEY in reply.content.metric_records:
        metrics.update(reply.content.metric_records[METRICS_KEY])
    metrics[LAYOUT_KEY] = json.dumps(layout)
    fitres = FitRes(
        Status(Code.OK, ""), ndarrays_to_parameters(split_limbs(flat, bits, limb_bits)), 1, metrics
    )
    return compat.fitres_to_recorddict(fitres, keep_input=True)


def _adapter(call_next: ClientAppCallable) -> ClientAppCallable:
    """Inner callable of secaggplus_mod: legacy FitIns → handler → legacy FitRes."""

    def handle(msg: Message, ctxt: Context) -> Message:
        cfg = msg.content.config_records[FITINS_CONFIG]
        inner = Message(content=unpack_content(bytes(cfg[CONTENT_KEY])), metadata=msg.metadata)  # type: ignore[arg-type]
        reply = call_next(inner, ctxt)
        if reply.has_error():
            raise RuntimeError(f"train handler failed: {reply.error.reason}")
        return Message(_legacy_reply(reply, int(cfg[BITS_KEY]), int(cfg[LIMB_KEY])), reply_to=msg)  # type: ignore[arg-type]

    return handle


def fedpriv_secaggplus_mod(msg: Message, ctxt: Context, call_next: ClientAppCallable) -> Message:
    """Run Flower's ``secaggplus_mod`` for SecAgg+ messages; pass any other message through."""
    if not msg.has_content() or RECORD_KEY_CONFIGS not in msg.content.config_records:
        return call_next(msg, ctxt)
    return secaggplus_mod(msg, ctxt, _adapter(call_next))


SECAGG_MODS: list[Mod] = [fedpriv_secaggplus_mod]
"""Mods to register on a ClientApp so it works with both the ideal and the SecAgg+ aggregator."""


# ---- probe client: fixed integer updates, for tests and the benchmark --------------------
def probe_update(
    seed: int, partition_id: int, server_round: int, shapes: dict[str, list[int]], bits: int
) -> dict[str, np.ndarray]:
    """Deterministic int64 residues in ``[0, 2**bits)`` for one client and round."""
    rng = np.random.default_rng([seed, partition_id, server_round])
    return {
        k: np.asarray(rng.integers(0, 1 << bits, size=tuple(s), dtype=np.int64))
        for k, s in shapes.items()
    }


def make_probe_client_app() -> ClientApp:
    """A ClientApp (with :data:`SECAGG_MODS`) whose train handler replies with :func:`probe_update`.

    The train message's ``config`` ConfigRecord carries ``seed``, ``server_round``, ``bits``,
    ``shapes`` (JSON ``{key: shape}``) and optionally ``fail_partitions`` (a list of partition
    ids whose handler raises, to simulate a dropout), ``sleep_partitions`` and
    ``sleep_seconds`` (clients that answer late, to simulate a timeout) and ``work_seconds`` (a
    sleep in every client standing in for local training).
    """
    app = ClientApp(mods=SECAGG_MODS)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        cfg: ConfigRecord = msg.content.config_records["config"]
        pid = int(context.node_config["partition-id"])
        if pid in [int(p) for p in cfg.get("fail_partitions", [])]:  # type: ignore[union-attr]
            raise RuntimeError(f"probe client {pid} drops out")
        time.sleep(float(cfg.get("work_seconds", 0.0)))  # type: ignore[arg-type]
        if pid in [int(p) for p in cfg.get("sleep_partitions", [])]:  # type: ignore[union-attr]
            time.sleep(float(cfg.get("sleep_seconds", 0.0)))  # type: ignore[arg-type]
        update = probe_update(
            int(cfg["seed"]),
            pid,
            int(cfg["server_round"]),
            json.loads(str(cfg["shapes"])),
            int(cfg["bits"]),
        )
        content = RecordDict(
            {
                UPDATE_KEY: ArrayRecord({k: Array(v) for k, v in update.items()}),
                METRICS_KEY: MetricRecord({"clients": 1.0}),
            }
        )
        return Message(content=content, reply_to=msg)

    return app
