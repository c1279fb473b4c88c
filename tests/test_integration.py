"""End to end through the real Flower simulation engine (Ray backend)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import dp_accounting
import pytest
from dp_accounting.pld import pld_privacy_accountant
from hydra import compose, initialize_config_dir

from fedpriv.accounting.secagg.spec import secagg_dpsgd
from fedpriv.common.errors import ConfigError
from fedpriv.run.config import conf_dir, register_schema
from fedpriv.run.prepare import prepare
from fedpriv.run.runner import run_experiment
from tests.cli import run_fedpriv

REPO = Path(__file__).resolve().parents[1]
SMALL = [
    "num_clients=3",
    "num_rounds=2",
    "client.steps=3",
    "progress=false",
    "ray_init_args.num_cpus=2",
]


def _cfg(overrides: list[str]):
    register_schema()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _pld_epsilon(sigma: float, q: float, steps: int, delta: float) -> float:
    """Independent ε: dp-accounting's PLD accountant composed directly."""
    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    return acc.get_epsilon(delta)


@pytest.mark.slow
def test_small_run_writes_outputs_and_reports_accountant_epsilon(tmp_path: Path) -> None:
    summary = run_experiment(_cfg(SMALL), tmp_path)
    for name in ("metrics.csv", "results.json", "model.npz", "curves.png", "config_resolved.yaml"):
        assert (tmp_path / name).is_file(), name
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["status"] == "complete" and summary["status"] == "complete"
    assert [r["server_round"] for r in res["rounds"]] == [1, 2]
    assert all(0.0 <= r["accuracy"] <= 1.0 and math.isfinite(r["loss"]) for r in res["rounds"])
    # 2 rounds x 3 local steps of one Poisson-sampled Gaussian (sigma=1.2, q=0.1) on the sum:
    # exactly the engine's secagg-dpsgd analysis (sigma of the sum 1.2, as the run's, 3 clients)
    engine = secagg_dpsgd("gaussian", 1.2, 3, 0.1, 3, 2, 1e-5)
    assert res["privacy"]["epsilon"] == pytest.approx(engine["epsilon"], rel=1e-9)
    assert res["privacy"]["local_epsilon"] == pytest.approx(engine["local_epsilon"], rel=1e-9)
    # ... and, independently, dp-accounting's PLD composed directly (grid differences: 1e-3)
    assert res["privacy"]["epsilon"] == pytest.approx(_pld_epsilon(1.2, 0.1, 6, 1e-5), rel=1e-3)
    assert res["rounds"][0]["epsilon"] == pytest.approx(_pld_epsilon(1.2, 0.1, 3, 1e-5), rel=1e-3)
    assert res["privacy"]["local_epsilon"] == pytest.approx(
        _pld_epsilon(1.2 / math.sqrt(3), 0.1, 6, 1e-5), rel=1e-3
    )
    for key in (
        "delta",
        "accountant",
        "noise_multiplier",
        "sample_rate",
        "steps",
        "num_rounds",
        "num_clients",
    ):
        assert key in res["privacy"]
    lines = (tmp_path / "metrics.csv").read_text().strip().splitlines()
    assert len(lines) == 3 and lines[0].startswith("server_round,accuracy,loss,epsilon")


@pytest.mark.slow
def test_plugin_example_runs(tmp_path: Path) -> None:
    overrides = SMALL[:-2] + [
        "num_rounds=1",
        "progress=false",
        "client._target_=examples.plugins.ClippedDeltaDPSGD",
        "+client.max_delta_norm=0.5",
        "strategy._target_=examples.plugins.DPFedAvgM",
        "strategy.server_momentum=0.9",
    ]
    summary = run_experiment(_cfg(overrides), tmp_path)
    assert summary["status"] == "complete"
    assert summary["privacy"]["epsilon"] == pytest.approx(_pld_epsilon(1.2, 0.1, 3, 1e-5), rel=1e-3)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("privacy.noise_multiplier=-1", "privacy.noise_multiplier=-1.0 must be >= 0"),
        ("privacy.max_grad_norm=0", "privacy.max_grad_norm=0.0 must be a finite number > 0"),
        ("privacy.sample_rate=1.5", "privacy.sample_rate=1.5 must be a finite number in [0, 1]"),
        ("privacy.target_delta=1", "privacy.target_delta=1.0 must be a finite number in (0, 1)"),
        ("num_clients=0", "num_clients=0 must be >= 1"),
        ("num_clients=100000", "num_clients=100000 must be <= the 6000 training samples"),
        ("client.steps=0", "client.steps=0 must be an integer >= 1"),
        ("privacy.target_epsilon=3", "give exactly one"),
        ("dataset.name=nope", "dataset.name='nope'"),
        ("partition=dirichlet,partition.alpha=0", "partition.alpha=0.0 must be > 0"),
        ("+client.stpes=3", "client.stpes=3 is not a parameter of clients.local_dpsgd.LocalDPSGD"),
        (
            "client._target_=nope.Nope",
            "client._target_='nope.Nope' could not be built: Error loading 'nope.Nope'",
        ),
        ("device=cuda", "no GPU is visible")
        if not __import__("torch").cuda.is_available()
        else ("device=gpu", "device='gpu'"),
    ],
)
def test_bad_config_is_refused_before_training(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        prepare(_cfg(override.split(",")))
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("privacy.noise_multiplier=-1", "privacy.noise_multiplier=-1.0 must be >= 0"),
        ("dataset=fashion_mnist,dataset.data_dir=/nonexistent", "/nonexistent"),
        ("privacy.noise_multiplier=abc", "privacy.noise_multiplier: Value 'abc'"),
        ("partition=foo", "available: dirichlet, iid"),
        (
            "client=client_level,privacy=client_level,privacy.clipping_norm=nan",
            "privacy.clipping_norm=nan must be a finite number > 0",
        ),
        (
            "+strategy.fraction=0.5",
            "strategy.fraction=0.5 is not a parameter of strategies.fedavg.DPFedAvg",
        ),
    ],
)
def test_cli_bad_config_exits_with_one_line(tmp_path: Path, override: str, message: str) -> None:
    out = tmp_path / "run"
    proc = run_fedpriv([*override.split(","), f"hydra.run.dir={out}"])
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("fedpriv: error: "), proc.stderr
    assert message in lines[0]
    assert not (out / "results.json").exists()


@pytest.mark.slow
def test_a_strategy_written_against_the_base_runs_end_to_end(tmp_path: Path) -> None:
    """examples/growing_cohort.py (issue 23, item 4): plugged in by ``strategy._target_``,
    its rounds accounted as they run: round r's sum holds 2r clients' noise of the 4 the
    shares are sized for, so its events are the local DP-SGD steps with σ √(2r / 4)."""
    overrides = [
        "num_clients=4",
        "num_rounds=2",
        "client.steps=2",
        "model=logistic",
        "progress=false",
        "ray_init_args.num_cpus=2",
        "strategy=custom",
        "strategy._target_=examples.growing_cohort.GrowingCohortDPFedAvg",
        "+strategy.initial_clients=2",
        "+strategy.growth=2",
    ]
    summary = run_experiment(_cfg(overrides), tmp_path)
    assert summary["status"] == "complete"
    rows = summary["rounds"]
    assert [r["cohort_size"] for r in rows] == [2, 4]
    assert [r["cohort_grown_to"] for r in rows] == [2.0, 4.0]
    assert [r["clients_dropped"] for r in rows] == [0, 0]
    acc = pld_privacy_accountant.PLDAccountant()
    step = lambda s: dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(s))  # noqa: E731
    acc.compose(step(1.2 * math.sqrt(2 / 4)), 2)  # round 1: 2 of 4 noise shares
    assert rows[0]["epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-3)
    acc.compose(step(1.2), 2)  # round 2: every share
    assert rows[1]["epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-3)
    assert rows[0]["epsilon"] > _pld_epsilon(1.2, 0.1, 2, 1e-5)  # fewer shares, more ε
