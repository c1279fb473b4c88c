"""How virtual clients map onto Flower nodes (:func:`fedpriv.run.layout.plan_layout`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from fedpriv.common.errors import ConfigError
from fedpriv.mechanisms.client_sampling import ClientSampling
from fedpriv.run.layout import local_actors, plan_layout
from fedpriv.run.plan import RunPlan, sampling_of
from fedpriv.run.setup import resolve_device
from tests.plans import node_with, plan_with


def _cfg(**top: Any) -> RunPlan:
    base: dict[str, Any] = {
        "num_clients": 10,
        "seed": 0,
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "ray_init_args": {"num_cpus": 2, "address": None},
    }
    for key, value in top.items():
        base[key] = {**base[key], **value} if key in ("client_resources",) else value
    return plan_with(**base)


@pytest.fixture(autouse=True)
def _no_ray_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


@pytest.mark.parametrize(
    ("cpus", "per_client", "actors"),
    [(2, 1, 2), (2, 0.5, 4), (3, 2, 1), (8, 0.3, 26), (1, 1, 1), (2, 3, 0)],
)
def test_local_actors_is_floor_of_cpus_over_client_cpus(
    cpus: int, per_client: float, actors: int
) -> None:
    cfg = _cfg(
        client_resources={"num_cpus": per_client, "num_gpus": 0.0},
        ray_init_args={"num_cpus": cpus, "address": None},
    )
    assert local_actors(cfg) == actors


def test_local_actors_defaults_to_the_machine_and_is_none_on_a_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 6)
    assert local_actors(_cfg(ray_init_args={})) == 6
    assert local_actors(_cfg(ray_init_args={"address": "ray://127.0.0.1:10001"})) is None
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert local_actors(_cfg(ray_init_args={})) is None
    # an explicit address "local" is taken before the environment variable: a local instance
    assert local_actors(_cfg(ray_init_args={"address": "local"})) == 6


def test_default_workers_one_per_actor_at_most_num_clients() -> None:
    layout = plan_layout(_cfg(), secagg=False, virtual_clients=True)
    assert (layout.num_workers, layout.one_node_per_client) == (2, False)
    assert layout.cohort.client_sampling is ClientSampling.ALL
    few = plan_layout(
        _cfg(num_clients=1, ray_init_args={"num_cpus": 4}), secagg=False, virtual_clients=True
    )
    assert few.num_workers == 1


def test_default_workers_on_a_cluster_is_num_clients() -> None:
    cfg = _cfg(ray_init_args={"address": "ray://127.0.0.1:10001"})
    assert plan_layout(cfg, secagg=False, virtual_clients=True).num_workers == 10
    # on a cluster the CPUs are not known here: any count up to num_clients is accepted
    assert (
        plan_layout(replace(cfg, num_workers=7), secagg=False, virtual_clients=True).num_workers
        == 7
    )


@pytest.mark.parametrize("workers", [1, 2])
def test_given_workers_within_limits(workers: int) -> None:
    layout = plan_layout(_cfg(num_workers=workers), secagg=False, virtual_clients=True)
    assert layout.num_workers == workers and not layout.one_node_per_client


@pytest.mark.parametrize(
    ("top", "message"),
    [
        ({"num_workers": 11}, "num_workers=11 must be <= num_clients=10"),
        ({"num_workers": 3}, "num_workers=3 has no CPUs: this machine runs 2 worker(s) at once"),
        ({"num_workers": 0}, "num_workers=0 must be an integer >= 1"),
        ({"num_workers": -2}, "num_workers=-2 must be an integer >= 1"),
        ({"num_workers": 1.5}, "num_workers=1.5 must be an integer >= 1"),
        (
            {"client_sampling": "fixed_size", "num_sampled_clients": 11},
            "num_sampled_clients=11 must be in 1..num_clients=10",
        ),
        (
            {"client_sampling": "poisson", "client_sample_rate": 0.0},
            "client_sample_rate=0.0 must be in (0, 1]",
        ),
    ],
)
def test_bad_worker_count_or_sampling_is_refused(top: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        plan_layout(_cfg(**top), secagg=False, virtual_clients=True)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_secagg_keeps_one_node_per_client() -> None:
    layout = plan_layout(_cfg(), secagg=True, virtual_clients=True)
    assert (layout.num_workers, layout.one_node_per_client) == (10, True)
    # one node per client even beyond the actors the CPUs allow (nodes share the actors)
    same = plan_layout(_cfg(num_workers=10), secagg=True, virtual_clients=True)
    assert same.num_workers == 10
    with pytest.raises(ConfigError, match="num_workers=2 must be null or num_clients=10: "):
        plan_layout(_cfg(num_workers=2), secagg=True, virtual_clients=True)


def test_strategy_without_virtual_clients_keeps_one_node_per_client() -> None:
    layout = plan_layout(_cfg(), secagg=False, virtual_clients=False)
    assert (layout.num_workers, layout.one_node_per_client) == (10, True)
    with pytest.raises(ConfigError, match="this strategy needs one Flower node per client"):
        plan_layout(_cfg(num_workers=2), secagg=False, virtual_clients=False)


@pytest.mark.parametrize(
    ("secagg", "virtual", "who"),
    [(True, True, "aggregator=secaggplus"), (False, False, "this strategy")],
)
@pytest.mark.parametrize(
    "sampling",
    [
        {"client_sampling": "poisson", "client_sample_rate": 0.5},
        {"client_sampling": "fixed_size", "num_sampled_clients": 5},
    ],
)
def test_client_sampling_refused_with_one_node_per_client(
    secagg: bool, virtual: bool, who: str, sampling: dict[str, Any]
) -> None:
    with pytest.raises(ConfigError) as info:
        plan_layout(_cfg(**sampling), secagg=secagg, virtual_clients=virtual)
    text = str(info.value)
    assert text.startswith(f"client_sampling='{sampling['client_sampling']}' is not supported")
    assert who in text


def test_cohort_sampler_reads_the_top_level_keys() -> None:
    node = node_with(client_sampling="fixed_size", num_sampled_clients=4, seed=9)
    s = sampling_of(node)
    assert (s.num_clients, s.num_sampled_clients, s.seed) == (10, 4, 9)
    assert s.client_sampling is ClientSampling.FIXED_SIZE
    node = node_with()
    node.pop("client_sampling")
    assert sampling_of(node).client_sampling is ClientSampling.ALL  # key absent: all
    assert sampling_of(node_with(client_sampling=None)).client_sampling is ClientSampling.ALL


@pytest.mark.parametrize(
    ("secagg", "virtual", "workers"),
    [(False, True, None), (False, True, 1), (True, True, None), (False, False, None)],
)
def test_client_resources_above_the_cpus_are_refused(
    secagg: bool, virtual: bool, workers: int | None
) -> None:
    """client_resources.num_cpus=3 on a 2-CPU instance: no actor could ever start (Ray would
    wait, then Flower's simulation crashes), whatever the layout."""
    cfg = _cfg(client_resources={"num_cpus": 3, "num_gpus": 0.0}, num_workers=workers)
    with pytest.raises(ConfigError) as info:
        plan_layout(cfg, secagg=secagg, virtual_clients=virtual)
    assert str(info.value) == (
        "client_resources.num_cpus=3.0 must be <= ray_init_args.num_cpus=2 (the local Ray "
        "instance's CPUs): no client actor could start"
    )


def test_no_actor_messages_name_the_machine_or_zero_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    res = {"num_cpus": 4, "num_gpus": 0.0}
    with pytest.raises(ConfigError) as info:
        plan_layout(
            _cfg(client_resources=res, ray_init_args={}), secagg=False, virtual_clients=True
        )
    assert str(info.value).startswith(
        "client_resources.num_cpus=4.0 must be <= this machine's 2 CPUs (ray_init_args"
    )
    # ray_init_args.num_cpus=0 is a (useless) value, not "unset": Ray would start with no CPU
    cfg = _cfg(ray_init_args={"num_cpus": 0})
    assert local_actors(cfg) == 0
    with pytest.raises(
        ConfigError, match=r"num_cpus=1.0 must be <= ray_init_args.num_cpus=0 \(the"
    ):
        plan_layout(cfg, secagg=False, virtual_clients=True)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the message on a machine without CUDA"
)
@pytest.mark.parametrize(
    "top, want",
    [
        (
            {"client_resources": {"num_gpus": 0.5}},
            r"device='auto' asks for CUDA \(client_resources",
        ),
        ({"device": "cuda"}, r"device='cuda' asks for CUDA but no GPU is visible"),
    ],
)
def test_cuda_without_a_gpu_names_what_asked_for_it(top: dict[str, Any], want: str) -> None:
    with pytest.raises(
        ConfigError, match=want + r".*use device=cpu, or client_resources.num_gpus=0"
    ):
        resolve_device(plan_with(**top))
    assert resolve_device(plan_with()) == torch.device("cpu")
