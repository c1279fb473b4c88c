"""Issue 13 end to end through Flower: a client-level run's ε per round is its spec's, the
adaptive clip norm is in metrics.csv and curves.png, random allocation pays for the rounds
of an epoch released."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from fedpriv.run.runner import run_experiment
from tests.test_client_level import _compose

SMALL = [
    "client=client_level",
    "privacy=client_level",
    "model=logistic",
    "num_clients=40",
    "num_workers=2",
    "progress=false",
    "ray_init_args.num_cpus=2",
]


def _rows(out: Path) -> list[dict[str, Any]]:
    with open(out / "metrics.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_poisson_adaptive_run_reports_its_spec_epsilon_and_the_clip_norm(tmp_path: Path) -> None:
    """Poisson q = 0.25, z = 1, σ_b = 2, γ = 0.5, 3 rounds: results.json's ε equals
    ``fedpriv-account client-level`` on the same settings (rel. 1e-9); metrics.csv holds the
    clip norm of each round, which moves, and the released unclipped fraction."""
    from fedpriv.cli.account import run

    extra = [
        "num_rounds=3",
        "client_sampling=poisson",
        "client_sample_rate=0.25",
        "client.target_unclipped_quantile=0.5",
        "privacy.count_noise_multiplier=2",
        "client.clip_learning_rate=1.0",
    ]
    summary = run_experiment(_compose([*SMALL, *extra]), tmp_path)
    assert summary["status"] == "complete"
    expected = run(
        "client-level",
        {
            "noise_multiplier": "1",
            "num_clients": "40",
            "client_sampling": "poisson",
            "client_sample_rate": "0.25",
            "count_noise_multiplier": "2",
            "num_rounds": "3",
            "target_delta": "1e-5",
        },
    )["epsilon"]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["privacy"]["epsilon"] == pytest.approx(expected, rel=1e-9)
    assert results["privacy"]["privacy_unit"] == "client"
    rows = _rows(tmp_path)
    clips = [float(r["clipping_norm"]) for r in rows]
    assert clips[0] == 1.0 and len(set(clips)) == 3
    assert all(r["unclipped_fraction"] != "" for r in rows)
    assert (tmp_path / "curves.png").stat().st_size > 0


@pytest.mark.slow
def test_random_allocation_run_charges_the_rounds_released(tmp_path: Path) -> None:
    """t = 2 rounds per epoch, k = 1, 4 rounds: round 1 is charged as one released round of
    the epoch (less than the epoch), round 2 completes it, rounds 3 and 4 the second epoch;
    every ε is its spec's for that many rounds (rel. 1e-9); every client trained exactly once
    per epoch (the cohort sizes of an epoch add up to num_clients)."""
    extra = [
        "num_rounds=4",
        "client_sampling=random_allocation",
        "allocation_window=2",
        "rounds_per_client=1",
    ]
    summary = run_experiment(_compose([*SMALL, *extra]), tmp_path)
    assert summary["status"] == "complete"
    from fedpriv.run.prepare import prepare

    spec = prepare(_compose([*SMALL, *extra]))[0].privacy
    eps = [float(r["epsilon"]) for r in _rows(tmp_path)]
    assert eps == pytest.approx([spec.epsilon(r) for r in range(1, 5)], rel=1e-9)
    assert eps == sorted(eps) and len(set(eps)) == 4
    sizes = [int(r["cohort_size"]) for r in _rows(tmp_path)]
    assert sizes[0] + sizes[1] == 40 and sizes[2] + sizes[3] == 40


@pytest.mark.slow  # Flower's SecAgg+ protocol, one node per client: ~1 min
def test_skellam_shares_through_secaggplus_report_the_specs_epsilon(tmp_path: Path) -> None:
    """client_level_skellam over Flower's real SecAgg+ (6 clients, 2 rounds): the run's ε is
    its Skellam spec's (rel. 1e-12) and the model learns (accuracy above chance 0.1)."""
    extra = [
        "client=client_level_skellam",
        "privacy=client_level_skellam",
        "privacy.accountant=rdp",
        "aggregator=secaggplus",
        "model=logistic",
        "num_clients=6",
        "num_rounds=2",
        "progress=false",
    ]
    summary = run_experiment(_compose(extra), tmp_path)
    assert summary["status"] == "complete"
    from fedpriv.run.prepare import prepare

    plan, _ = prepare(_compose(extra))
    spec = plan.privacy
    expected = spec.accounting.epsilon([(e, 2 * n) for e, n in spec.round_events()])
    assert summary["privacy"]["epsilon"] == pytest.approx(expected, rel=1e-12)
    assert summary["rounds"][-1]["accuracy"] > 0.1
