"""Client sampling (:mod:`fedpriv.mechanisms.client_sampling`): the draws, their statistics,
and the bad input a user can type on the command line (one line, exit 2, nothing trained or
written)."""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant

from fedpriv.common.errors import ConfigError
from fedpriv.mechanisms.client_sampling import ClientSampling, CohortSampler
from tests.cli import run_fedpriv

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------
# draws


def test_all_is_every_id_every_round() -> None:
    s = CohortSampler(num_clients=7)
    assert s.client_sampling is ClientSampling.ALL
    for r in (1, 2, 50):
        ids = s.draw(r)
        assert ids.dtype == np.int64 and ids.tolist() == list(range(7))
    assert s.expected_size == 7.0 and s.nominal_size == 7 and not s.varies


def test_fixed_size_draws_k_distinct_sorted_ids_deterministic_per_seed_and_round() -> None:
    n, k = 1000, 37
    s = CohortSampler(n, "fixed_size", num_sampled_clients=k, seed=5)
    assert s.client_sampling is ClientSampling.FIXED_SIZE  # the string is parsed to the enum
    draws = {r: s.draw(r) for r in range(1, 21)}
    for ids in draws.values():
        assert ids.dtype == np.int64 and len(ids) == k
        assert len(np.unique(ids)) == k and np.all(np.diff(ids) > 0)  # distinct, sorted
        assert ids.min() >= 0 and ids.max() <= n - 1
    # a function of (seed, round): a fresh sampler with the same seed draws the same cohorts
    again = CohortSampler(n, "fixed_size", num_sampled_clients=k, seed=5)
    assert all(np.array_equal(again.draw(r), ids) for r, ids in draws.items())
    # ... and different cohorts across rounds and across seeds (P[two equal] = 1/C(1000, 37))
    assert len({tuple(ids) for ids in draws.values()}) == len(draws)
    other = CohortSampler(n, "fixed_size", num_sampled_clients=k, seed=6)
    assert not np.array_equal(other.draw(1), draws[1])
    assert s.expected_size == 37.0 and s.nominal_size == 37 and not s.varies


def test_fixed_size_k_equal_n_is_everyone() -> None:
    s = CohortSampler(12, "fixed_size", num_sampled_clients=12, seed=0)
    assert s.draw(3).tolist() == list(range(12))


def test_fixed_size_is_uniform_over_clients() -> None:
    """Each client's inclusion count over R rounds is Binomial(R, k/N): every client within
    5 sigma (P[some client outside] < 200 * 6e-7)."""
    n, k, rounds = 200, 20, 1000
    s = CohortSampler(n, "fixed_size", num_sampled_clients=k, seed=1)
    counts = np.zeros(n)
    for r in range(1, rounds + 1):
        counts[s.draw(r)] += 1
    p = k / n
    mean, sd = rounds * p, math.sqrt(rounds * p * (1 - p))
    assert np.all(np.abs(counts - mean) <= 5 * sd), (counts.min(), counts.max(), mean, sd)
    assert counts.sum() == rounds * k


def test_poisson_inclusion_frequency_matches_rate() -> None:
    """Inclusions over N clients x R rounds ~ Binomial(N R, q): total within 5 sigma, and each
    client's count within 5 sigma of Binomial(R, q); cohorts deterministic per (seed, round)."""
    n, q, rounds = 200, 0.3, 500
    s = CohortSampler(n, "poisson", client_sample_rate=q, seed=3)
    assert s.client_sampling is ClientSampling.POISSON and s.varies
    counts = np.zeros(n)
    sizes = []
    for r in range(1, rounds + 1):
        ids = s.draw(r)
        assert ids.dtype == np.int64 and np.all(np.diff(ids) > 0)
        assert len(ids) == 0 or (ids.min() >= 0 and ids.max() <= n - 1)
        counts[ids] += 1
        sizes.append(len(ids))
    total_mean, total_sd = n * rounds * q, math.sqrt(n * rounds * q * (1 - q))
    assert abs(counts.sum() - total_mean) <= 5 * total_sd, (counts.sum(), total_mean, total_sd)
    one_mean, one_sd = rounds * q, math.sqrt(rounds * q * (1 - q))
    assert np.all(np.abs(counts - one_mean) <= 5 * one_sd)
    assert len(set(sizes)) > 1  # the cohort size varies
    again = CohortSampler(n, "poisson", client_sample_rate=q, seed=3)
    assert np.array_equal(again.draw(17), s.draw(17))
    assert not np.array_equal(s.draw(17), s.draw(18))


def test_poisson_rate_one_is_everyone_and_tiny_rate_can_be_empty() -> None:
    s = CohortSampler(9, "poisson", client_sample_rate=1.0, seed=0)
    assert all(s.draw(r).tolist() == list(range(9)) for r in range(1, 6))
    tiny = CohortSampler(5, "poisson", client_sample_rate=1e-9, seed=0)
    assert len(tiny.draw(1)) == 0  # P[non-empty] = 5e-9


@pytest.mark.parametrize(
    ("n", "q", "expected", "nominal"),
    [
        (1000, 0.1, 100.0, 100),
        (1000, 0.0105, 10.5, 10),  # floor
        (10, 0.01, 0.1, 1),  # at least 1
        (3, 1 / 3, 1.0, 1),  # 1/3 * 3 = 0.999...: the floor is taken with a 1e-9 margin
        (100000, 0.01, 1000.0, 1000),
    ],
)
def test_poisson_expected_and_nominal_size(n: int, q: float, expected: float, nominal: int) -> None:
    s = CohortSampler(n, "poisson", client_sample_rate=q)
    assert s.expected_size == pytest.approx(expected, rel=1e-12)
    assert s.nominal_size == nominal


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"client_sampling": "poisson"}, "client_sample_rate=None is not set: give"),
        ({"client_sampling": "poisson", "client_sample_rate": 0.0}, "client_sample_rate=0.0 must"),
        ({"client_sampling": "poisson", "client_sample_rate": 1.5}, "client_sample_rate=1.5 must"),
        ({"client_sampling": "poisson", "client_sample_rate": -0.1}, "client_sample_rate=-0.1"),
        ({"client_sampling": "poisson", "client_sample_rate": math.nan}, "client_sample_rate=nan"),
        ({"client_sampling": "poisson", "client_sample_rate": math.inf}, "client_sample_rate=inf"),
        ({"client_sampling": "fixed_size"}, "num_sampled_clients=None is not set: give"),
        ({"client_sampling": "fixed_size", "num_sampled_clients": 11}, "num_sampled_clients=11"),
        ({"client_sampling": "fixed_size", "num_sampled_clients": 0}, "num_sampled_clients=0"),
        ({"client_sample_rate": 0.5}, "client_sample_rate=0.5 needs client_sampling=poisson"),
        ({"num_sampled_clients": 3}, "num_sampled_clients=3 needs client_sampling=fixed_size"),
        (
            {"client_sampling": "poisson", "client_sample_rate": 0.5, "num_sampled_clients": 3},
            "num_sampled_clients=3 needs client_sampling=fixed_size (not poisson)",
        ),
        ({"client_sampling": "bogus"}, "client_sampling='bogus' must be one of"),
    ],
)
def test_bad_sampler_is_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        CohortSampler(10, **kwargs)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_num_clients_below_one_is_refused() -> None:
    with pytest.raises(ConfigError, match="num_clients=0 must be >= 1"):
        CohortSampler(0)


# ---------------------------------------------------------------------------------------------
# bad input through the command line, as a user types it


def _cli(args: list[str], out: Path) -> subprocess.CompletedProcess:
    return run_fedpriv([*args, f"hydra.run.dir={out}", "progress=false"])


SKELLAM = ["client=skellam_dpsgd"]  # privacy=skellam: RDP by default


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["num_clients=10", "client_sampling=fixed_size", "num_sampled_clients=11"],
            "num_sampled_clients=11 must be in 1..num_clients=10",
        ),
        (
            ["client_sampling=poisson", "client_sample_rate=0"],
            "client_sample_rate=0.0 must be in (0, 1]",
        ),
        (
            ["client_sampling=poisson", "client_sample_rate=1.5"],
            "client_sample_rate=1.5 must be in (0, 1]",
        ),
        (
            ["client_sampling=poisson", "client_sample_rate=nan"],
            "client_sample_rate=nan must be a finite number in (0, 1]",
        ),
        (
            ["client_sampling=poisson", "client_sample_rate=-0.1"],
            "client_sample_rate=-0.1 must be in (0, 1]",
        ),
        (["num_clients=3", "num_workers=4"], "num_workers=4 must be <= num_clients=3"),
        (
            ["ray_init_args.num_cpus=2", "client_resources.num_cpus=1", "num_workers=3"],
            "num_workers=3 has no CPUs: this machine runs 2 worker(s) at once",
        ),
        (
            ["ray_init_args.num_cpus=2", "client_resources.num_cpus=3"],
            "client_resources.num_cpus=3.0 must be <= ray_init_args.num_cpus=2 (the local Ray "
            "instance's CPUs): no client actor could start",
        ),
        (
            ["ray_init_args.num_cpus=0"],
            "client_resources.num_cpus=1.0 must be <= ray_init_args.num_cpus=0 (the local Ray",
        ),
        (
            ["client_sampling=poisson", "client_sample_rate=0.5", "num_sampled_clients=3"],
            "num_sampled_clients=3 needs client_sampling=fixed_size (not poisson)",
        ),
        (
            ["client_sampling=bogus"],
            "client_sampling='bogus' must be one of: all, poisson, fixed_size",
        ),
        (
            # honest-but-curious Skellam: a Poisson cohort of 1 leaves no trusted noise
            [
                *SKELLAM,
                "privacy.honest_but_curious=true",
                "client_sampling=poisson",
                "client_sample_rate=0.2",
            ],
            "client_sampling='poisson' draws cohorts of varying size, and SkellamSpec cannot "
            "account a round with fewer than 2 clients",
        ),
        (
            [
                *SKELLAM,
                "aggregator=secaggplus",
                "client_sampling=fixed_size",
                "num_sampled_clients=5",
            ],
            "client_sampling='fixed_size' is not supported with aggregator=secaggplus",
        ),
        (
            [
                "strategy=checkin",
                "client=checkin",
                "privacy=checkin",
                "client_sampling=fixed_size",
                "num_sampled_clients=5",
            ],
            "client_sampling='fixed_size' is not supported with client=checkin",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_cli_bad_sampling_or_workers_exits_2_with_one_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    out = tmp_path / "run"
    proc = _cli(args, out)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("fedpriv: error: "), proc.stderr
    assert message in lines[0], lines[0]
    # nothing of the run is written (Hydra's own .hydra/ and the log of fedpriv.cli.experiment
    # are all there is)
    written = {p.name for p in out.iterdir()} if out.exists() else set()
    assert written <= {".hydra", "experiment.log"}, written


# ---------------------------------------------------------------------------------------------
# end to end: a fixed-size cohort through the Flower simulation engine


def _pld_epsilon(sigma: float, q: float, steps: int, delta: float) -> float:
    """Independent ε: dp-accounting's PLD accountant, Poisson-subsampled Gaussian composed."""
    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    return acc.get_epsilon(delta)


@pytest.mark.slow
def test_fixed_size_cohort_end_to_end(tmp_path: Path) -> None:
    """20 registered clients, 5 per round, 2 workers, 2 rounds of 2 local DP-SGD steps.

    The sum's noise is σ = 1.2 whatever the cohort, so ε is that of 2 × 2 Poisson-subsampled
    Gaussian steps; each client's own share is σ/√5 (5 contributors), which the local ε shows
    (with 20 it would be σ/√20). Tolerance: 1e-3 relative (PLD grid of dp-accounting).
    """
    out = tmp_path / "run"
    args = [
        "num_clients=20",
        "client_sampling=fixed_size",
        "num_sampled_clients=5",
        "num_workers=2",
        "model=logistic",
        "num_rounds=2",
        "client.steps=2",
        "ray_init_args.num_cpus=2",
        "plot=false",
        "save_model=false",
    ]
    proc = _cli(args, out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "20 clients (fixed_size cohort of 5) on 2 workers" in proc.stdout + proc.stderr
    res = json.loads((out / "results.json").read_text())
    assert res["status"] == "complete"
    rounds = res["rounds"]
    assert [r["server_round"] for r in rounds] == [1, 2]
    assert [r["cohort_size"] for r in rounds] == [5, 5]
    assert [r["clients_dropped"] for r in rounds] == [0, 0]
    assert res["privacy"]["client_sampling"] == "fixed_size"
    assert res["privacy"]["num_sampled_clients"] == 5
    sigma, q, delta = 1.2, 0.1, 1e-5
    assert res["privacy"]["epsilon"] == pytest.approx(_pld_epsilon(sigma, q, 4, delta), rel=1e-3)
    assert rounds[0]["epsilon"] == pytest.approx(_pld_epsilon(sigma, q, 2, delta), rel=1e-3)
    local5 = _pld_epsilon(sigma / math.sqrt(5), q, 4, delta)
    local20 = _pld_epsilon(sigma / math.sqrt(20), q, 4, delta)
    assert res["privacy"]["local_epsilon"] == pytest.approx(local5, rel=1e-3)
    assert local20 > 1.5 * local5  # the check above tells 5 contributors from 20
    # metrics.csv has the same cohort sizes and ε per round
    lines = (out / "metrics.csv").read_text().strip().splitlines()
    header = lines[0].split(",")
    rows = [dict(zip(header, ln.split(","), strict=False)) for ln in lines[1:]]
    assert [int(float(r["cohort_size"])) for r in rows] == [5, 5]
    assert float(rows[-1]["epsilon"]) == pytest.approx(res["privacy"]["epsilon"], rel=1e-9)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("client_sampling=", "client_sampling='' must be one of"),
        ("vmap_clients=2", "vmap_clients=2 must be true, false or null"),
    ],
)
def test_values_that_coerce_silently_are_refused(override: str, message: str) -> None:
    """An empty sampling name, a number for a boolean switch and a string for seconds are
    refused before anything trains, naming the field and the value."""
    from hydra import compose, initialize_config_dir

    from fedpriv.common.errors import ConfigError
    from fedpriv.run.config import conf_dir, register_schema
    from fedpriv.run.prepare import build_server, prepare, run_layout

    register_schema()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["model=logistic", override])
    with pytest.raises(ConfigError, match=re.escape(message)):
        plan, algorithm = prepare(cfg)
        run_layout(plan)
        build_server(plan, algorithm)  # the CLI's path: Hydra's wrapper unwrapped


def test_a_string_for_seconds_is_refused_when_the_config_is_composed() -> None:
    """The strategy's schema (made from DPFedAvg's fields) types ``pull_interval``: Hydra
    refuses ``abc`` for it, naming the key, before any plan is made."""
    from fedpriv.run.config import compose_config

    with pytest.raises(Exception) as info:
        compose_config(["model=logistic", "strategy.pull_interval=abc"])
    text = str(info.value.__cause__ or info.value)
    assert "strategy.pull_interval" in text and "'abc'" in text
