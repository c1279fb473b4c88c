"""Issue 27 item 2, the fast part: when a job joins a local sweep's one Ray instance
(fedpriv/run/warm_engine.py). The end-to-end sweep (one start, the same figures as a run alone)
is tests/test_sweep.py::test_local_sweep_starts_ray_once."""

from __future__ import annotations

import pytest

from fedpriv.run.warm_engine import WARM_KEYS, sweep_jobs, warm_address


def test_no_head_outside_a_local_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert warm_address({"num_cpus": 2}) is None


@pytest.mark.parametrize(
    "init_args",
    [
        {"address": "127.0.0.1:6379"},  # a cluster the user named
        {"num_cpus": 2, "_temp_dir": "/tmp/fpr"},  # settings a shared head cannot honour
        {"num_cpus": 2, "object_store_memory": 10**8},
    ],
)
def test_jobs_with_their_own_ray_settings_start_their_own(
    init_args: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with sweep_jobs():
        assert warm_address(init_args) is None


def test_ray_address_in_the_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    with sweep_jobs():
        assert warm_address({"num_cpus": 2}) is None


def test_the_default_ray_settings_can_share() -> None:
    from fedpriv.run.runner import DEFAULT_RAY_INIT

    assert set(DEFAULT_RAY_INIT) | {"address", "num_cpus", "num_gpus"} <= WARM_KEYS
