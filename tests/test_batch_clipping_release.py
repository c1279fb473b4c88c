"""Issue 11, item 1, for the batch-clipping family: measured from the SERIALIZED replies.

Every client's reply is built by ``fedpriv.run.client_app.train_handler`` (as a Flower run builds
it) and round-tripped through Flower 1.42's protobuf serde (``recorddict_to_proto`` /
``recorddict_from_proto``). From those bytes we measure, for every client of IID, Dirichlet
(alpha = 0.05: sizes 2 ... 1196) and natural (ACSIncome states WY, VT, AL: 2451 ... 17814
records) partitions:

* the noise std per coordinate of the reply (reply at sigma minus reply at sigma = 0, same
  seeds: one local round from the same model, so the difference is the noise alone);
* the factor ``scale`` by which the client turns its clipped sum ``U`` into the reply:
  ``||reply(D) - reply(D')|| / ||U(D) - U(D')||`` with ``D'`` = ``D`` with one record replaced
  (or, for Poisson, removed), ``U`` computed independently by ``clipped_sum``;
* so the influence of the most influential record is ``scale * sens`` (``sens`` = 2C for
  replace-one, C for add/remove: the clipping bound, tested in test_batch_clipping_client)
  and the effective noise multiplier is ``noise_std / (scale * sens)``.

It must be >= the accounted sigma for every client, and for the released sum (all clients'
noise, divided by the same ``num_clients``) with the largest ``scale`` of any client.
Tolerance: the noise std is estimated from >= 20,000 Gaussian draws (relative sd
``1/sqrt(2 n)`` <= 0.5 %); we allow 5 sd plus 0.5 % for float32 summation order.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto

import fedpriv.run.client_app as app
from fedpriv.common.wire import METRICS_KEY, UPDATE_KEY
from fedpriv.data.client_data import ClientData
from fedpriv.run.config import compose_config, to_container
from fedpriv.run.engine import node_messages
from fedpriv.run.plan import RunPlan
from fedpriv.run.prepare import build_spec, plan_of, prepare
from fedpriv.run.setup import build_model_for, client_partition, partitions

SIGMA, CLIP, LR = 1.3, 0.5, 0.1
ACS = "acs-income/feda4fair_cross_silo_value_2018"


pytestmark = pytest.mark.usefixtures("task_identity")


def _cfg(overrides: list[str]) -> Any:
    return compose_config(overrides)


def _sizes(overrides: list[str]) -> list[int]:
    """The clients' partition sizes of a config (its plan, before the client is bound)."""
    node = to_container(_cfg(overrides))
    parts = partitions(plan_of(node, build_spec(node["privacy"])))
    return [len(parts[i]) for i in range(len(parts))]


def _partition_overrides(name: str, shared: Path) -> list[str]:
    if name == "iid":
        return ["partition=iid"]
    if name == "dirichlet":
        return ["partition=dirichlet", "partition.alpha=0.05"]
    return [
        "dataset=acs_income",
        f"dataset.data_dir={shared / ACS}",
        "+dataset.options.states=[WY,VT,AL]",
        "partition=natural",
        "num_clients=3",
    ]


def _reply(run_cfg: RunPlan, pid: int, server_round: int, data: ClientData) -> tuple[Any, dict]:
    """The client's reply as the server receives it: train_handler (the worker decodes the
    plan's payload and builds the client), then protobuf serde."""
    state = {k: v.numpy() for k, v in build_model_for(run_cfg).state_dict().items()}
    msg = node_messages([pid + 1], state, server_round)[0]
    ctx = Context(
        run_id=1,
        node_id=pid + 1,
        node_config={"partition-id": pid},
        state=RecordDict(),
        run_config={},
    )
    original = app.client_data
    app.client_data = lambda plan_json, partition_id: data  # type: ignore[assignment]
    try:
        reply = app.train_handler(run_cfg.to_payload(), msg, ctx)
    finally:
        app.client_data = original  # type: ignore[assignment]
    content = recorddict_from_proto(recorddict_to_proto(reply.content))
    arrays = content.array_records[UPDATE_KEY].to_numpy_ndarrays()
    flat = np.concatenate([a.reshape(-1).astype(np.float64) for a in arrays])
    return flat, dict(content.metric_records[METRICS_KEY])


def _clipped_u(run_cfg: RunPlan, algo: Any, data: ClientData, used: int) -> np.ndarray:
    model = build_model_for(run_cfg)
    x = data.x[:used].unsqueeze(1)
    y = data.y[:used].unsqueeze(1)
    u = algo.clipped_sum(model, x, y, LR, CLIP)
    return torch.cat([t.reshape(-1).double() for t in u.values()]).numpy()


def _neighbour(data: ClientData, relation: str) -> ClientData:
    """Replace record 0 by a far-away record of another class, or remove it (add/remove)."""
    if relation == "add_remove":
        return ClientData(data.x[1:], data.y[1:], data.partition_id)
    x, y = data.x.clone(), data.y.clone()
    x[0] = -8.0 * x[-1]
    y[0] = (y[-1] + 1) % 2
    return ClientData(x, y, data.partition_id)


@pytest.mark.parametrize("sampler", ["subsample", "poisson"])
@pytest.mark.parametrize("partition", ["iid", "dirichlet", "natural"])
def test_effective_noise_multiplier_of_most_influential_record(
    partition: str, sampler: str, shared_data: Path
) -> None:
    base = [
        "client=individual_clipping",
        "model=logistic",
        "client.local_rounds=1",
        "client.epochs=null",
        f"client.lr={LR}",
        f"privacy.clipping_norm={CLIP}",
        *_partition_overrides(partition, shared_data),
    ]
    sizes = _sizes(base)
    if sampler == "subsample":  # all of the first N records in the round: U is known exactly
        base += ["client.sampler=subsample", f"client.num_groups={min(sizes)}"]
    else:  # q = 1: every record of the client (its whole data, whatever its size)
        base += ["client.sampler=poisson", "privacy.sample_rate=1.0", "client.num_groups=64"]
    run_cfg, algo = prepare(_cfg([*base, f"privacy.noise_multiplier={SIGMA}"]))
    quiet_cfg, quiet = prepare(_cfg([*base, "privacy.noise_multiplier=0"]))
    assert algo.normalizer == quiet.normalizer == float(algo.num_groups)  # public, config only
    assert algo.privacy_summary()["normalizer"] == algo.normalizer
    relation = algo.privacy.neighboring_relation.value
    sens = CLIP if relation == "add_remove" else 2 * CLIP
    assert sens == algo.privacy.sensitivity()  # the spec states the clipper's sensitivity
    events = sum(count for _, count in algo.privacy.round_events())
    stds, scales = [], []
    for pid, n in enumerate(sizes):
        x, y = client_partition(run_cfg, pid)
        data = ClientData(torch.from_numpy(x), torch.from_numpy(y), pid)
        used = n if sampler == "poisson" else min(sizes)
        clean, _ = _reply(quiet_cfg, pid, 1, data)
        other = _neighbour(data, relation)
        clean2, _ = _reply(quiet_cfg, pid, 1, other)
        du = _clipped_u(run_cfg, algo, data, used) - _clipped_u(
            run_cfg, algo, other, used - (sampler == "poisson")
        )
        scale = float(np.linalg.norm(clean - clean2) / np.linalg.norm(du))
        assert scale == pytest.approx(LR / algo.normalizer, rel=5e-3)  # float32 sum order
        noise = []
        rounds = max(1, math.ceil(20_000 / clean.size))
        for r in range(1, rounds + 1):  # independent noise per server round (seeded by it)
            noisy, metrics = _reply(run_cfg, pid, r, data)
            assert metrics["noise_draws"] == metrics["local_rounds"] == events
            noise.append(noisy - clean)
        z = np.concatenate(noise)
        std = float(z.std())
        tol = 5 / math.sqrt(2 * z.size) + 5e-3
        eff = std / (scale * sens)
        assert eff >= SIGMA * (1 - tol), (partition, sampler, pid, n, eff)
        assert eff == pytest.approx(SIGMA, rel=tol)  # exactly the accounted sigma, no more
        stds.append(std)
        scales.append(scale)
    # the released sum: every client's noise, the largest per-record influence of any client
    eff_sum = math.sqrt(sum(s * s for s in stds)) / (max(scales) * sens)
    assert eff_sum >= SIGMA * math.sqrt(len(sizes)) * (1 - 0.02)


@pytest.mark.parametrize("sampler", ["shuffle", "subsample"])
def test_every_client_composes_the_accounted_number_of_rounds(
    sampler: str, shared_data: Path
) -> None:
    # natural partitions of 2451, 3014 and 17814 records, one epoch per server round: the
    # biggest client runs no more local rounds (noise draws) than the ledger composes, namely
    # N // (m s) with N = 2451 the smallest partition (public under replace-one)
    cfg = _cfg(
        [
            "client=batch_clipping",
            f"client.sampler={sampler}",
            "model=logistic",
            "client.group_size=64",
            *_partition_overrides("natural", shared_data),
        ]
    )
    run_cfg, algo = prepare(cfg)
    events = sum(count for _, count in algo.privacy.round_events())
    assert events == 2451 // 64 == algo.privacy_summary()["local_rounds_per_server_round"]
    for pid in range(3):
        x, y = client_partition(run_cfg, pid)
        data = ClientData(torch.from_numpy(x), torch.from_numpy(y), pid)
        _, metrics = _reply(run_cfg, pid, 1, data)
        assert metrics["noise_draws"] == metrics["local_rounds"] == events, (pid, len(data))
        assert metrics["examples"] == events * 64  # m s = 64 records per local round
