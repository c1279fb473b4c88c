"""A probe client for SecAgg+ tests and the benchmark: fixed integer updates.

The client-side SecAgg+ mod lives in the core (:data:`fedpriv.run.secagg_codec.SECAGG_MODS`).
"""

from __future__ import annotations

import json
import time

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedpriv.common.wire import METRICS_KEY, UPDATE_KEY
from fedpriv.run.secagg_codec import SECAGG_MODS


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
            int(str(cfg["seed"])),
            pid,
            int(str(cfg["server_round"])),
            json.loads(str(cfg["shapes"])),
            int(str(cfg["bits"])),
        )
        content = RecordDict(
            {
                UPDATE_KEY: ArrayRecord({k: Array(v) for k, v in update.items()}),
                METRICS_KEY: MetricRecord({"clients": 1.0}),
            }
        )
        return Message(content=content, reply_to=msg)

    return app
