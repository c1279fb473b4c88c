"""The Flower ``ClientApp``: receives the global model, runs the client algorithm, replies.

The run's resolved config travels inside the app (it is shipped to the Ray actors), so a
worker that re-imports this module does no argument parsing. Each virtual client finds its
data by its ``partition-id`` (Flower's node config) and seeds its randomness from
``(seed, server_round, partition_id)``, or from OS entropy in ``secure_mode``.

Engine glue, so it lives in the core.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedpriv.aggregation import aggregator_class
from fedpriv.algorithm import ClientData, TrainContext
from fedpriv.noise import make_generator
from fedpriv.notices import quiet_known_notices
from fedpriv.setup import build_algorithm, build_model_for, client_partition, resolve_device
from fedpriv.wire import CONFIG_KEY, METRICS_KEY, MODEL_KEY, UPDATE_KEY

quiet_known_notices()  # this module is imported by every Ray worker that runs a client


@lru_cache(maxsize=4)
def _client_data(cfg_json: str, partition_id: int) -> ClientData:
    x, y = client_partition(json.loads(cfg_json), partition_id)
    return ClientData(torch.from_numpy(x), torch.from_numpy(y), partition_id)


@lru_cache(maxsize=4)
def _algorithm(cfg_json: str) -> Any:
    return build_algorithm(json.loads(cfg_json))


def train_handler(cfg: dict[str, Any], msg: Message, context: Context) -> Message:
    """Run one round of the configured client algorithm and reply with its update."""
    torch.set_num_threads(1)
    cfg_json = json.dumps(cfg, sort_keys=True)
    partition_id = int(context.node_config["partition-id"])
    server_round = int(str(msg.content.config_records[CONFIG_KEY]["server_round"]))
    data = _client_data(cfg_json, partition_id)
    algorithm = _algorithm(cfg_json)
    device = resolve_device(cfg)
    model = build_model_for(cfg).to(device)
    model.load_state_dict(msg.content.array_records[MODEL_KEY].to_torch_state_dict())
    secure = bool(cfg["privacy"].get("secure_mode"))
    seed_seq = None if secure else [int(cfg["seed"]), server_round, partition_id]
    rng = np.random.default_rng(seed_seq)
    generator = make_generator(int(rng.integers(2**62)), device=device, secure_mode=secure)
    ctx = TrainContext(server_round=server_round, rng=rng, generator=generator, device=device)
    update, metrics = algorithm.train(model, data, ctx)
    content = RecordDict(
        {
            UPDATE_KEY: ArrayRecord({k: v.detach().cpu().contiguous() for k, v in update.items()}),
            METRICS_KEY: MetricRecord({k: float(v) for k, v in metrics.items()}),
        }
    )
    return Message(content=content, reply_to=msg)


def make_client_app(cfg: dict[str, Any]) -> ClientApp:
    """A ``ClientApp`` whose ``train`` handler runs the configured client algorithm.

    An algorithm may take over whole messages: ``train_message_handler(cfg, msg, context)``
    for train messages and ``query_handler(cfg, msg, context)`` for query messages. The
    SecAgg+ client mods are registered when the configured aggregator declares
    ``uses_secagg_mods``.
    """
    secagg = bool(getattr(aggregator_class(cfg.get("aggregator")), "uses_secagg_mods", False))
    if secagg:
        from fedpriv.secagg import SECAGG_MODS

    app = ClientApp(mods=list(SECAGG_MODS) if secagg else None)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        handler = getattr(
            _algorithm(json.dumps(cfg, sort_keys=True)), "train_message_handler", None
        )
        return (
            handler(cfg, msg, context) if handler is not None else train_handler(cfg, msg, context)
        )

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        """Query messages go to the algorithm's ``query_handler`` (e.g. random check-ins)."""
        algorithm = _algorithm(json.dumps(cfg, sort_keys=True))
        handler = getattr(algorithm, "query_handler", None)
        if handler is None:
            raise RuntimeError(f"{type(algorithm).__name__} answers no query messages")
        return handler(cfg, msg, context)

    return app
