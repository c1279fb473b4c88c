"""Issue 27 items 1 and 3: the local engine (forked worker processes, no Ray) runs a seeded run
exactly as Flower's Ray backend does, and ``engine=auto`` picks it wherever it can.

- ``engine=processes`` and ``engine=ray``: the same ε every round, the same accuracy and loss,
  and the same final model, tolerance 0 (slow: it starts Ray), for worker messages (DP-SGD),
  client-level DP-FedAvg and random check-ins (query messages and per-node state);
- the processes engine against the server run in this process (``InProcessGrid``, the
  handlers called directly): identical (fast);
- ``engine=auto`` resolves to processes on one machine and to Ray for a cluster address,
  SecAgg+, CUDA, clients of 2+ CPUs, a run inside a Ray job, or a platform that cannot fork;
  ``engine=processes`` with any of those is refused in one line naming ``engine``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from fedpriv.common.errors import ConfigError
from fedpriv.run.config import conf_dir, register_schema
from fedpriv.run.layout import run_engine
from fedpriv.run.plan import Engine
from fedpriv.run.runner import run_experiment
from tests.plans import plan_with
from tests.test_resume import _in_process

BASE = [
    "num_clients=4",
    "model=logistic",
    "num_rounds=2",
    "progress=false",
    "plot=false",
    "ray_init_args.num_cpus=2",
]
KINDS = {
    "dpsgd": ["client.steps=2"],
    "client_level": ["client=client_level", "privacy=client_level"],
    "checkin": ["client=checkin", "strategy=checkin", "num_rounds=3"],
}


def _cfg(overrides: list[str]) -> Any:
    register_schema()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose(config_name="config", overrides=[*BASE, *overrides])


def _outcome(out: Path) -> tuple[list[Any], dict[str, np.ndarray], dict[str, Any]]:
    res = json.loads((out / "results.json").read_text())
    rows = [(r["epsilon"], r["accuracy"], r["loss"]) for r in res["rounds"]]
    with np.load(out / "model.npz") as data:
        return rows, {k: data[k] for k in data.files}, res


def _assert_same(a: Path, b: Path) -> None:
    rows_a, model_a, _ = _outcome(a)
    rows_b, model_b, _ = _outcome(b)
    assert rows_a == rows_b
    assert model_a.keys() == model_b.keys()
    for key in model_a:
        np.testing.assert_array_equal(model_a[key], model_b[key])


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_processes_and_ray_give_the_same_run(kind: str, tmp_path: Path) -> None:
    for engine in ("processes", "ray"):
        summary = run_experiment(_cfg([f"engine={engine}", *KINDS[kind]]), tmp_path / engine)
        assert summary["status"] == "complete", summary["message"]
    _assert_same(tmp_path / "processes", tmp_path / "ray")
    engines = {e: _outcome(tmp_path / e)[2]["engine"] for e in ("processes", "ray")}
    assert engines["processes"]["kind"] == "processes" and engines["ray"]["kind"] == "ray"
    assert engines["processes"]["ray_nodes"] == []
    if kind != "checkin":  # the check-in slots are not summed through worker parts
        assert len(engines["ray"]["ray_nodes"]) == 1


def test_processes_engine_equals_the_handlers_called_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, task_identity: None
) -> None:
    summary = run_experiment(_cfg(["engine=processes", *KINDS["dpsgd"]]), tmp_path / "processes")
    assert summary["status"] == "complete", summary["message"]
    with monkeypatch.context() as patch:
        _in_process(patch.setattr)  # the Ray path's server, on a grid in this process
        run_experiment(_cfg(["engine=ray", *KINDS["dpsgd"]]), tmp_path / "here")
    _assert_same(tmp_path / "processes", tmp_path / "here")
    assert _outcome(tmp_path / "processes")[2]["engine"] == {
        "kind": "processes",
        "num_workers": 2,
        "ray_nodes": [],
    }


def _plan(**top: Any) -> Any:
    base: dict[str, Any] = {"num_clients": 4, "seed": 0, "ray_init_args": {"address": None}}
    return plan_with(**{**base, **top})


@pytest.fixture(autouse=True)
def _no_ray_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def test_auto_is_processes_on_one_machine_and_ray_where_needed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert run_engine(_plan(), secagg=False) is Engine.PROCESSES
    assert run_engine(_plan(engine="ray"), secagg=False) is Engine.RAY
    cluster = _plan(ray_init_args={"address": "127.0.0.1:6379"})
    assert run_engine(cluster, secagg=False) is Engine.RAY
    assert run_engine(_plan(), secagg=True) is Engine.RAY
    gpu = _plan(client_resources={"num_cpus": 1, "num_gpus": 0.5})
    assert run_engine(gpu, secagg=False) is Engine.RAY
    assert run_engine(_plan(device="cuda"), secagg=False) is Engine.RAY
    two_cpus = _plan(client_resources={"num_cpus": 2, "num_gpus": 0.0})
    assert run_engine(two_cpus, secagg=False) is Engine.RAY  # OpenMP after fork
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert run_engine(_plan(), secagg=False) is Engine.RAY
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setattr("multiprocessing.get_all_start_methods", lambda: ["spawn"])  # Windows
    assert run_engine(_plan(), secagg=False) is Engine.RAY


@pytest.mark.parametrize(
    ("top", "secagg", "why"),
    [
        ({"ray_init_args": {"address": "127.0.0.1:6379"}}, False, "a Ray cluster"),
        ({}, True, "Flower's SecAgg"),
        ({"client_resources": {"num_cpus": 1, "num_gpus": 1.0}}, False, "CUDA"),
        ({"client_resources": {"num_cpus": 2, "num_gpus": 0.0}}, False, "client_resources"),
    ],
)
def test_processes_where_ray_is_needed_is_refused(
    top: dict[str, Any], secagg: bool, why: str
) -> None:
    want = rf"^engine='processes' is not possible with {why}.*: use engine=ray or auto$"
    with pytest.raises(ConfigError, match=want):
        run_engine(_plan(engine="processes", **top), secagg=secagg)


def test_an_unknown_engine_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="engine"):
        _plan(engine="threads")
