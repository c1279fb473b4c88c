"""The local DP-SGD client: exact steps without noise, noise-only steps on empty batches."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from clients.local_dpsgd import LocalDPSGD
from fedpriv.accounting.dpsgd import DPSGDSpec
from fedpriv.common.errors import ConfigError
from fedpriv.data.client_data import ClientData
from fedpriv.mechanisms.noise import make_generator
from fedpriv.models.zoo import build_model
from fedpriv.run.algorithm import TrainContext


def _ctx(seed: int = 0) -> TrainContext:
    return TrainContext(
        server_round=1,
        rng=np.random.default_rng(seed),
        generator=make_generator(seed),
        device=torch.device("cpu"),
    )


def _data(n: int = 12, d: int = 5) -> ClientData:
    g = torch.Generator().manual_seed(0)
    return ClientData(torch.randn(n, d, generator=g), torch.randint(0, 3, (n,), generator=g), 0)


def test_noiseless_full_batch_step_matches_manual_clipped_sgd() -> None:
    data = _data()
    model = build_model("logistic", (5,), 3)
    ref = build_model("logistic", (5,), 3)
    ref.load_state_dict(model.state_dict())
    algo = LocalDPSGD(
        steps=1,
        lr=0.5,
        normalizer=7.0,
        privacy=DPSGDSpec(noise_multiplier=0.0, max_grad_norm=0.3, sample_rate=1.0, num_clients=4),
    )
    update, metrics = algo.train(model, data, _ctx())
    # manual: per-example autograd, clip each to C, sum, divide by the public normalizer B = 7
    total = {k: torch.zeros_like(p) for k, p in ref.named_parameters()}
    for i in range(len(data)):
        ref.zero_grad()
        nn.functional.cross_entropy(
            ref(data.x[i : i + 1]), data.y[i : i + 1], reduction="sum"
        ).backward()
        grads = {k: p.grad.clone() for k, p in ref.named_parameters()}
        norm = math.sqrt(sum(float(g.pow(2).sum()) for g in grads.values()))
        factor = min(1.0, 0.3 / norm)
        for k in total:
            total[k] += factor * grads[k]
    for k, t in total.items():
        torch.testing.assert_close(update[k], -0.5 * t / 7.0, rtol=1e-5, atol=1e-6)
    assert metrics["steps"] == 1 and metrics["examples"] == len(data)
    assert metrics["noise_draws"] == 1 == sum(c for _, c in algo.privacy.round_events())


def test_empty_batches_take_noise_only_steps() -> None:
    data = _data(n=3)
    model = build_model("logistic", (5,), 3)
    algo = LocalDPSGD(
        steps=4,
        lr=1.0,
        normalizer=1.0,
        privacy=DPSGDSpec(noise_multiplier=1.0, max_grad_norm=1.0, sample_rate=1e-9, num_clients=1),
    )
    update, metrics = algo.train(model, data, _ctx())
    assert metrics["empty_batches"] == 4 and metrics["examples"] == 0
    # all four steps still add noise: the update is pure noise, nonzero
    assert any(float(u.abs().sum()) > 0 for u in update.values())


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"steps": 0}, "client.steps"),
        ({"lr": 0.0}, "client.lr"),
        ({"momentum": 1.0}, "client.momentum"),
    ],
)
def test_bad_client_fields(kw: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        LocalDPSGD(privacy=DPSGDSpec(noise_multiplier=1.0, num_clients=2), **kw)
