"""Issue 24: client-level DP-FTRL's accounting, noise and run binding.

Independent references: dp-accounting's own accountants on the events DP-FedAvg composes (the
identity factorization must give the same ε and the same noise), the closed-form Gaussian
(μ-GDP, Dong, Roth, Su 2019, arXiv:1905.02383, Cor. 2.13: δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ −
μ/2)), and the explicit matrix product of the materialised noise matrix.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pytest
from dp_accounting import dp_event
from scipy import optimize, stats

from clients.client_level_dpfedavg import ClientLevelDPFedAvg
from clients.client_level_ftrl import ClientLevelFTRL
from fedpriv.accounting.client_level.spec import ClientLevelSpec
from fedpriv.accounting.ftrl.spec import FTRLSpec
from fedpriv.common.errors import ConfigError
from fedpriv.mechanisms.client_sampling import ClientSampling, CohortSampler
from fedpriv.run.config import compose_config
from fedpriv.run.prepare import prepare
from fedpriv.run.run_privacy import RunPrivacy


def ftrl(n: int, z: float = 1.0, acc: str = "rdp", **kw: Any) -> FTRLSpec:
    return FTRLSpec(noise_multiplier=z, num_rounds=n, accountant=acc, **kw)


def gdp_epsilon(mu: float, delta: float) -> float:
    """ε of μ-GDP at δ (Dong, Roth, Su, Cor. 2.13), by root finding (1e-12)."""

    def gap(eps: float) -> float:
        d = stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
        return float(d - delta)

    return float(optimize.brentq(gap, 0.0, 500.0, xtol=1e-12))


# ------------------------------------------------------------------ accounting


def test_identity_with_every_round_equals_dp_fedavg_without_sampling() -> None:
    """identity, k = n participations b = 1 apart: the Gaussian of sensitivity √n with noise z;
    DP-FedAvg (client_sampling=all) composes n Gaussians of multiplier z: RDP equal to 1e-9,
    and both equal the exact μ = √n / z GDP value (PLD within 1 %, RDP above it)."""
    n, z = 50, 3.0
    every = {"participation": "min_separation", "max_participations": n, "min_separation": 1}
    mine = ftrl(n, z, factorization="identity", **every)
    fedavg = ClientLevelSpec(
        noise_multiplier=z, cohort=CohortSampler(10, ClientSampling.ALL), accountant="rdp"
    )
    assert mine.epsilon(n) == pytest.approx(fedavg.epsilon(n), rel=1e-9)
    exact = gdp_epsilon(math.sqrt(n) / z, 1e-5)
    pld = ftrl(n, z, acc="pld", factorization="identity", **every)
    assert exact <= pld.epsilon(n) <= 1.01 * exact
    assert mine.epsilon(n) >= exact


def test_amplified_at_q_one_equals_the_unamplified_gaussian_with_sensitivity_sqrt_k() -> None:
    """cyclic Poisson with q = 1 over b groups (identity: one band) is k = ceil(n/b) Gaussians
    of multiplier z; the unamplified analysis of min_separation (k, b) gives sensitivity √k:
    the same RDP ε (1e-9)."""
    n, b, z = 40, 7, 2.0
    k = math.ceil(n / b)
    cohort = CohortSampler(70, ClientSampling.POISSON, client_sample_rate=1.0)
    amp = ftrl(
        n,
        z,
        factorization="identity",
        participation="cyclic_poisson",
        min_separation=b,
        cohort=cohort,
    )
    plain = ftrl(
        n,
        z,
        factorization="identity",
        participation="min_separation",
        max_participations=k,
        min_separation=b,
    )
    assert plain.prefix_sensitivities[-1][1] == pytest.approx(math.sqrt(k), rel=1e-12)
    assert amp.epsilon(n) == pytest.approx(plain.epsilon(n), rel=1e-9)


def test_one_band_amplified_is_dp_fedavg_with_poisson_sampling() -> None:
    """cyclic Poisson with b = 1 group and the identity: each round a Poisson-q Gaussian, the
    events of DP-FedAvg with client_sampling=poisson (PLD, same events: equal ε)."""
    n, q, z = 30, 0.05, 1.1
    cohort = CohortSampler(400, ClientSampling.POISSON, client_sample_rate=q)
    amp = FTRLSpec(
        noise_multiplier=z,
        num_rounds=n,
        factorization="identity",
        participation="cyclic_poisson",
        min_separation=1,
        cohort=cohort,
    )
    fedavg = ClientLevelSpec(noise_multiplier=z, cohort=cohort)
    assert amp.epsilon(n) == pytest.approx(fedavg.epsilon(n), rel=1e-12)
    event = amp.prefix_events(0, 1)[0][0]
    assert event == dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z))


def test_prefix_bound_grows_and_charges_skipped_rounds() -> None:
    """ε after t released rounds is non-decreasing; releasing round 9 after round 2 (rounds 3-8
    not released) charges the same as releasing rounds 1..9 (the prefix's sensitivity)."""
    n = 30
    spec = ftrl(
        n,
        2.0,
        factorization="identity",
        participation="min_separation",
        max_participations=4,
        min_separation=3,
    )
    eps = [spec.epsilon(t) for t in range(1, n + 1)]
    assert all(a <= b + 1e-12 for a, b in zip(eps, eps[1:]))
    skipping = RunPrivacy(spec, 1)
    skipping.record_round(None, 1)
    skipping.record_round(None, 2)
    skipping.record_round(None, 9)
    assert skipping.epsilon() == pytest.approx(spec.epsilon(9), rel=1e-12)
    # at the end μ = √min(k, ceil(n/b)) / z = √4 / 2: the exact GDP value (PLD within 1 %)
    exact = gdp_epsilon(1.0, 1e-5)
    pld = ftrl(
        n,
        2.0,
        acc="pld",
        factorization="identity",
        participation="min_separation",
        max_participations=4,
        min_separation=3,
    )
    assert exact <= pld.epsilon(n) <= 1.01 * exact and spec.epsilon(n) >= exact


def test_calibration_meets_the_target_within_a_tenth_of_a_percent() -> None:
    spec = FTRLSpec(
        noise_multiplier=None,
        target_epsilon=2.0,
        num_rounds=20,
        factorization="identity",
        participation="min_separation",
        max_participations=3,
        min_separation=5,
    )
    cal = spec.calibrated(2.0, 20)
    assert cal.calibrated_from_target_epsilon == 2.0 and cal.target_epsilon is None
    assert 0.99 * 2.0 <= cal.epsilon(20) <= 2.0
    # μ-GDP closed form: the prefix is μ = √3 / z
    assert cal.epsilon(20) == pytest.approx(gdp_epsilon(math.sqrt(3) / cal.sigma, 1e-5), rel=2e-3)


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"participation": "min_separation", "min_separation": 2}, "privacy.max_participations"),
        ({"participation": "single", "min_separation": 2}, "privacy.min_separation=2"),
        ({"factorization": "tree_online", "bands": 3}, "privacy.bands=3"),
        (
            {
                "participation": "min_separation",
                "max_participations": 2,
                "min_separation": 2,
                "bands": 3,
            },
            "privacy.bands=3",
        ),
        ({"factorization": "qr"}, "privacy.factorization='qr'"),
        ({"buffers": 0}, "privacy.buffers=0"),
        ({"secure_mode": True}, "privacy.secure_mode=True"),
        ({"count_noise_multiplier": 3.0}, "privacy.count_noise_multiplier=3.0"),
    ],
)
def test_bad_input_is_refused_naming_the_field(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        FTRLSpec(noise_multiplier=1.0, num_rounds=10, **kw)
    assert str(info.value).startswith(field), str(info.value)


# ------------------------------------------------------------------ the run's noise


BASE = [
    "client=client_level_ftrl",
    "model=logistic",
    "num_clients=6",
    "num_rounds=5",
    "seed=4",
    "privacy.factorization=identity",
    "privacy.participation=min_separation",
    "privacy.max_participations=5",
    "privacy.min_separation=1",
]


def test_identity_release_is_dp_fedavgs_noise_bit_for_bit() -> None:
    """The same seed, round and sum: the identity factorization's release equals DP-FedAvg's
    trusted-aggregator release exactly (same draws, dtype, order and arithmetic)."""
    _, mine = prepare(compose_config(BASE + ["privacy.noise_multiplier=0.7"]))
    _, theirs = prepare(
        compose_config(
            ["client=client_level", "privacy=client_level", "model=logistic", "num_clients=6"]
            + ["num_rounds=5", "seed=4", "privacy.noise_multiplier=0.7"]
        )
    )
    assert isinstance(mine, ClientLevelFTRL) and isinstance(theirs, ClientLevelDPFedAvg)
    rng = np.random.default_rng(0)
    total = {"w": rng.normal(size=(10, 784)).astype(np.float32), "b": np.ones(10, np.float32)}
    for r in (1, 2, 3):
        a, _, _ = mine.release(dict(total), r, {"clipping_norm": 1.0})
        b, _, _ = theirs.release(dict(total), r, {"clipping_norm": 1.0})
        for k in total:
            assert np.array_equal(a[k], b[k]), (r, k)


def test_the_stream_replays_bit_for_bit_from_any_round() -> None:
    """A resumed run asks for round 4 first: the replayed stream gives the same noise as the
    run that stepped 1, 2, 3, 4 (banded, 3 bands)."""
    extra = ["privacy.factorization=banded", "privacy.noise_multiplier=1.0"]
    over = [o for o in BASE if "factorization" not in o] + extra
    over = [o for o in over if "min_separation" not in o and "max_participations" not in o]
    over += ["privacy.participation=single", "privacy.bands=3"]
    _, first = prepare(compose_config(over))
    _, resumed = prepare(compose_config(over))
    zero = {"w": np.zeros((10, 784), np.float32), "b": np.zeros(10, np.float32)}
    seq = [first.release(dict(zero), r, {})[0] for r in (1, 2, 3, 4)]
    late = resumed.release(dict(zero), 4, {})[0]
    for k in zero:
        assert np.array_equal(seq[-1][k], late[k])
    assert not np.array_equal(seq[0]["w"], seq[1]["w"])


# ------------------------------------------------------------------ the start-up check


def test_a_stream_that_is_not_the_accounted_matrix_stops_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The materialised noise matrix of a WRONG stream (the tree's noise halved in round 5:
    less noise there, so its sensitivity grows) exceeds the analytic one: start-up refuses."""
    spec = ftrl(
        64,
        1.0,
        factorization="tree_honaker",
        participation="min_separation",
        max_participations=4,
        min_separation=8,
    )
    assert spec.startup_check()["materialized_sensitivity"] <= spec.prefix_sensitivities[-1][1]
    honest = spec.strategy.stream

    def wrong(dim: int) -> Any:
        inner = honest(dim)

        class Halved:
            t = 0
            vectors_held = 0

            def step(self, draw: Any) -> np.ndarray:
                self.t += 1
                w = inner.step(draw)
                return w / 2 if self.t == 5 else w

        return Halved()

    bad = ftrl(
        64,
        1.0,
        factorization="tree_honaker",
        participation="min_separation",
        max_participations=4,
        min_separation=8,
    )
    import dataclasses

    copy = dataclasses.replace(spec.strategy)  # the catalogue's instance is shared: a copy
    object.__setattr__(copy, "stream", wrong)
    bad.__dict__["strategy"] = copy
    with pytest.raises(ConfigError, match=r"^privacy.factorization='tree_honaker' cannot run"):
        bad.startup_check()


# ------------------------------------------------------------------ the CLI is the run


def test_fedpriv_account_ftrl_answers_the_runs_epsilon() -> None:
    """``fedpriv-account ftrl`` with the run's settings prints the ε the run's spec accounts."""
    from fedpriv.cli.account import run as account

    out = account(
        "ftrl",
        {
            "factorization": "tree_online",
            "participation": "min_separation",
            "max_participations": "3",
            "min_separation": "4",
            "num_rounds": "24",
            "noise_multiplier": "2.0",
            "target_delta": "1e-5",
        },
    )
    spec = ftrl(
        24,
        2.0,
        acc="pld",
        factorization="tree_online",
        participation="min_separation",
        max_participations=3,
        min_separation=4,
    )
    assert out["epsilon"] == pytest.approx(spec.epsilon(24), rel=1e-12)
    assert out["sensitivity"] == pytest.approx(spec.prefix_sensitivities[-1][1], rel=1e-12)
    cal = account(
        "ftrl",
        {"factorization": "identity", "num_rounds": "10", "target_epsilon": "1.5"}
        | {"target_delta": "1e-5"},
    )
    assert 0.99 * 1.5 <= cal["epsilon"] <= 1.5 and cal["calibrated"] == "noise_multiplier"


# ------------------------------------------------------------------ whole runs, in process


RUN = ["model=logistic", "num_clients=6", "num_workers=2", "progress=false", "plot=false"]
RUN += ["client.batch_size=500", "privacy.accountant=rdp", "strategy.server_optimizer=fedavgm"]


def _run_in_process(run_dir: Any, overrides: list[str]) -> dict[str, Any]:
    from fedpriv.run.runner import run_experiment

    return run_experiment(compose_config([*RUN, *overrides]), run_dir)


@pytest.fixture()
def in_process(monkeypatch: pytest.MonkeyPatch, task_identity: None) -> None:
    from tests.test_resume import _in_process

    _in_process(monkeypatch.setattr)


def test_identity_run_is_dp_fedavgs_run_bit_for_bit(in_process: None, tmp_path: Any) -> None:
    """The whole run (6 clients, every round, FedAvgM): DP-FTRL with the identity and k = n
    participations 1 round apart trains the same model as DP-FedAvg, bit for bit, at the same
    ε (RDP, 1e-9)."""
    from tests.test_resume import _outcome

    n = 4
    _run_in_process(
        tmp_path / "ftrl",
        ["client=client_level_ftrl", "privacy.factorization=identity", f"num_rounds={n}"]
        + ["privacy.participation=min_separation", f"privacy.max_participations={n}"]
        + ["privacy.min_separation=1", "privacy.noise_multiplier=0.8"],
    )
    _run_in_process(
        tmp_path / "avg",
        ["client=client_level", "privacy=client_level", f"num_rounds={n}"]
        + ["privacy.noise_multiplier=0.8"],
    )
    (a, ra, _), (b, rb, _) = _outcome(tmp_path / "ftrl"), _outcome(tmp_path / "avg")
    assert ra["status"] == rb["status"] == "complete"
    assert all(np.array_equal(a[k], b[k]) for k in b)
    assert ra["privacy"]["epsilon"] == pytest.approx(rb["privacy"]["epsilon"], rel=1e-9)


def test_killed_ftrl_run_resumes_to_the_same_model_and_epsilon(
    in_process: None, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BandMF (3 bands, cyclic groups): death while writing round 4's checkpoint, then
    ``resume``: the replayed noise stream and enforcement give the same model bit for bit and
    the same ε and rows as the uninterrupted run."""
    from fedpriv.run import checkpoint, resume
    from fedpriv.run.runner import run_experiment
    from tests.test_resume import REAL_SAVE, _dies_at, _Killed, _outcome

    over = ["client=client_level_ftrl", "num_rounds=7", "privacy.factorization=banded"]
    over += ["privacy.participation=cyclic_poisson", "privacy.min_separation=3"]
    over += ["client_sampling=poisson", "client_sample_rate=1.0"]
    ref, run_dir = tmp_path / "ref", tmp_path / "run"
    _run_in_process(ref, over)
    monkeypatch.setattr(checkpoint, "save", _dies_at(5))
    with pytest.raises(_Killed):
        _run_in_process(run_dir, over)
    monkeypatch.setattr(checkpoint, "save", REAL_SAVE)
    run_experiment(resume.resume_config(run_dir, []), run_dir)
    (m, r, rows), (m0, r0, rows0) = _outcome(run_dir), _outcome(ref)
    assert r["status"] == "complete" and all(np.array_equal(m[k], m0[k]) for k in m0)
    assert r["privacy"]["epsilon"] == r0["privacy"]["epsilon"] and rows == rows0
    header = rows0[0]
    counts = [float(row[header.index("max_client_participations")]) for row in rows0[1:]]
    assert counts == [1, 1, 1, 2, 2, 2, 3]  # each client once per 3 rounds, as enforced


def test_dense_with_several_participations_beyond_its_limit_is_refused_in_one_line() -> None:
    spec = FTRLSpec(
        noise_multiplier=1.0,
        num_rounds=501,
        factorization="dense",
        participation="min_separation",
        max_participations=2,
        min_separation=100,
    )
    with pytest.raises(ConfigError, match=r"^num_rounds=501 must be <= 500 .* use privacy"):
        spec.strategy  # noqa: B018


def test_a_diurnal_availability_trace_never_breaks_the_enforced_pattern(
    in_process: None, tmp_path: Any
) -> None:
    """A run with ``availability.period=4 availability.available_fraction=0.5`` (each device
    reachable half of each 4-round day) and 2 participations 3 rounds apart: every cohort the
    server sent obeys the pattern and holds reachable clients only (the run's own enforcement
    replayed and checked with ``check_pattern``)."""
    from fedpriv.mechanisms.enforced_cohort import AvailabilityTrace, EnforcedCohort, check_pattern
    from fedpriv.run.prepare import prepare

    over = ["client=client_level_ftrl", "num_rounds=9", "privacy.factorization=tree_online"]
    over += ["privacy.participation=min_separation", "privacy.max_participations=2"]
    over += ["privacy.min_separation=3", "availability.period=4"]
    over += ["availability.available_fraction=0.5", "num_clients=12", "seed=2"]
    plan, algorithm = prepare(compose_config([*RUN, *over]))
    assert plan.availability == AvailabilityTrace(4, 0.5, seed=2)
    result = _run_in_process(tmp_path / "run", over)
    assert result["status"] == "complete"
    enforced = EnforcedCohort(
        plan.cohort, algorithm.privacy.pattern, availability=plan.availability, seed=2
    )
    history = [enforced.draw(t) for t in range(1, 10)]
    check_pattern(history, algorithm.privacy.pattern)
    for t, ids in enumerate(history, start=1):
        assert plan.availability.available(t, 12)[ids].all()
    sizes = [len(h) for h in history if len(h)]  # the divisor: the non-empty cohorts' mean
    assert algorithm.normalizer == pytest.approx(np.mean(sizes))
    with pytest.raises(ConfigError, match=r"^availability.period=4 needs a privacy family"):
        prepare(compose_config([*RUN, "client=client_level", "privacy=client_level"] + over[6:8]))


def test_a_resume_that_changes_num_rounds_is_refused_for_correlated_noise(
    in_process: None, tmp_path: Any
) -> None:
    """Rows of a 4-round and a 6-round factorization are not one accounted mechanism: a
    finished FTRL run cannot be extended (a new-user finding: ε was under-reported)."""
    from fedpriv.run import resume

    run_dir = tmp_path / "run"
    _run_in_process(run_dir, ["client=client_level_ftrl", "num_rounds=4"])
    with pytest.raises(ConfigError, match=r"cannot change num_rounds \(saved 4, given 6\)"):
        resume.resume_config(run_dir, ["num_rounds=6"])


@pytest.mark.parametrize(
    ("pair", "message"),
    [
        (["client=client_level_ftrl", "privacy=client_level"], "privacy='client_level' does not"),
        (
            ["client=client_level", "privacy=ftrl"],
            "privacy='ftrl' does not fit ClientLevelDPFedAvg",
        ),
    ],
)
def test_a_client_with_another_familys_spec_is_refused_in_one_line(
    pair: list[str], message: str
) -> None:
    from fedpriv.run.prepare import prepare

    with pytest.raises(ConfigError, match=f"^{re.escape(message)}"):
        prepare(compose_config([*RUN, *pair, "num_rounds=3"]))


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"factorization": "blt", "buffers": 17}, "privacy.buffers=17"),
        ({"num_rounds": 100_001}, "num_rounds=100001"),
        (
            {"participation": "min_separation", "max_participations": 2, "min_separation": 11},
            "privacy.min_separation=11",
        ),
        ({"bands": 11}, "privacy.bands=11"),
    ],
)
def test_sizes_that_would_hang_are_refused(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        FTRLSpec(**{"noise_multiplier": 1.0, "num_rounds": 10, **kw})
    assert str(info.value).startswith(field), str(info.value)


def test_fedpriv_account_ftrl_needs_num_rounds() -> None:
    from fedpriv.cli.account import run as account

    with pytest.raises(ConfigError, match="^num_rounds=None is required"):
        account(
            "ftrl", {"factorization": "identity", "noise_multiplier": "1", "target_delta": "1e-5"}
        )
