"""Shared test fixtures: the ../shared data directory beside the checkout; Flower's task
identity for building messages outside a running app."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from flwr.supercore.task_identity import TaskIdentity
from hypothesis import settings

from fedpriv.run.warm_engine import ray_head

# Property tests draw the same examples on every run (derandomized): CI never meets an example
# a developer's run did not; a new example is a change to the test, reviewed as such.
settings.register_profile("fedpriv", derandomize=True, deadline=None)
settings.load_profile("fedpriv")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data directory {SHARED_DATA} not present")
    return SHARED_DATA


@pytest.fixture(scope="session")
def cifar_dir(shared_data: Path) -> Path:
    """../shared/data/cifar10-jpg, holding at least the 5k/1k subset archive."""
    path = shared_data / "cifar10-jpg"
    if not (path / "cifar10_jpg_subset_5k_train_1k_test.tar.gz").is_file():
        pytest.skip(f"no CIFAR-10 subset archive in {path}")
    return path


@pytest.fixture()
def task_identity():
    """Flower 1.42 needs a task identity to build messages outside an app; restored after."""
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


@pytest.fixture(scope="session")
def shared_ray() -> Iterator[str]:
    """The loopback address of one Ray instance shared by the session's in-process runs
    (:func:`tests.shared_ray.run_shared`); started on first use, stopped at the end."""
    with ray_head() as address:
        yield address
