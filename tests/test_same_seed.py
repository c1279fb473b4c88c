"""Issue 14, item 5: the same seed gives the same numbers, for every strategy.

Each configuration runs twice through the real Flower simulation (Ray backend, 2 workers, so
that replies arrive in varying order); the two runs must agree exactly: every round's
accuracy, loss and ε, and the final model bit for bit (tolerance 0).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedpriv.run.runner import run_experiment
from tests.test_faults import TINY, _cfg

STRATEGIES = {
    "fedavg": [*TINY, "num_rounds=3"],
    "async_fedavg": [*TINY, "num_rounds=3", "strategy=async_fedavg", "strategy.max_staleness=2"],
    "checkin_poisson": [
        "client=checkin",
        "privacy=checkin",
        "strategy=checkin",
        "model=logistic",
        "progress=false",
        "num_clients=20",
        "client.variant=poisson",
        "client.num_slots=10",
        "strategy.batch_size=3",
    ],
    "client_level_poisson": [
        "client=client_level",
        "privacy=client_level",
        "model=logistic",
        "progress=false",
        "num_clients=8",
        "num_rounds=3",
        "client_sampling=poisson",
        "client_sample_rate=0.5",
        "client.target_unclipped_quantile=0.5",
        "privacy.count_noise_multiplier=2",
    ],
    "secaggplus": [
        "client=skellam_dpsgd",
        "aggregator=secaggplus",
        "privacy.accountant=rdp",
        "num_clients=3",
        "num_rounds=2",
        "client.steps=2",
        "progress=false",
    ],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_same_seed_same_numbers(name: str, tmp_path: Path) -> None:
    runs = [run_experiment(_cfg(STRATEGIES[name]), tmp_path / str(i)) for i in range(2)]
    assert [r["status"] for r in runs] == ["complete", "complete"]
    for a, b in zip(runs[0]["rounds"], runs[1]["rounds"], strict=True):
        for key in ("accuracy", "loss", "epsilon"):
            assert a.get(key) == b.get(key), (name, a["server_round"], key)
    with np.load(tmp_path / "0" / "model.npz") as m0, np.load(tmp_path / "1" / "model.npz") as m1:
        assert sorted(m0.files) == sorted(m1.files)
        for key in m0.files:
            np.testing.assert_array_equal(m0[key], m1[key], err_msg=f"{name}: {key}")
