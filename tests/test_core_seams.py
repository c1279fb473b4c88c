"""Issue 11 at the core's seams: non-finite values (item 4), the noise source (item 7), group
sizes and non-private runs (item 8), enums and declared aggregator capabilities.

Unit tests call the aggregators, the Job and the strategy directly; two tiny end-to-end runs
(2 clients, 1-2 rounds, logistic model, embedded dataset) go through Flower's engine.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Message, MessageType, MetricRecord, RecordDict
from hydra import compose, initialize_config_dir
from torch import nn

from clients.local_dpsgd import LocalDPSGD
from fedpriv.accounting.core.privacy_spec import EventRuns, UnaccountableRound
from fedpriv.accounting.core.vocabulary import Accountant, Conversion, NoiseSource
from fedpriv.accounting.dpsgd import DPSGDSpec
from fedpriv.common.errors import ConfigError
from fedpriv.common.wire import METRICS_KEY, UPDATE_KEY
from fedpriv.data.client_data import ClientData
from fedpriv.run.aggregation import (
    NON_FINITE,
    AggregateResult,
    Aggregator,
    IdealAggregator,
    RoundFailed,
    aggregator_class,
)
from fedpriv.run.algorithm import ClientAlgorithm, TrainContext
from fedpriv.run.config import conf_dir, register_schema
from fedpriv.run.engine import node_messages
from fedpriv.run.header import header_line, noise_facts
from fedpriv.run.job import ServerJob
from fedpriv.run.plan import RunPlan
from fedpriv.run.prepare import prepare, run_layout
from fedpriv.run.round_log import RoundLog, dropped_note
from fedpriv.run.run_privacy import RunPrivacy
from fedpriv.run.runner import run_experiment
from strategies.fedavg import DPFedAvg

REPO = Path(__file__).resolve().parents[1]
TINY = [
    "num_clients=2",
    "model=logistic",
    "client.steps=2",
    "progress=false",
    "plot=false",
    "ray_init_args.num_cpus=2",
]


pytestmark = pytest.mark.usefixtures("task_identity")


def _cfg(overrides: list[str]) -> Any:
    register_schema()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


# ---- item 4: non-finite config values -----------------------------------------------------
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("privacy.max_grad_norm=inf", "privacy.max_grad_norm=inf must be a finite number > 0"),
        ("privacy.max_grad_norm=nan", "privacy.max_grad_norm=nan must be a finite number > 0"),
        (
            "privacy.noise_multiplier=inf",
            "privacy.noise_multiplier=inf must be a finite number >= 0",
        ),
        (
            "privacy.noise_multiplier=nan",
            "privacy.noise_multiplier=nan must be a finite number >= 0",
        ),
        (
            "privacy.noise_multiplier=null,privacy.target_epsilon=inf",
            "privacy.target_epsilon=inf must be a finite number > 0",
        ),
        ("privacy.target_delta=nan", "privacy.target_delta=nan must be a finite number in (0, 1)"),
        ("privacy.sample_rate=nan", "privacy.sample_rate=nan must be a finite number in [0, 1]"),
        ("privacy.stop_at_epsilon=inf", "privacy.stop_at_epsilon=inf must be a finite number > 0"),
        (
            "client=checkin,privacy.local_delta=nan",
            "privacy.local_delta=nan must be a finite number in [0, 1)",
        ),
        (
            "client=client_level,privacy.clipping_norm=inf",
            "privacy.clipping_norm=inf must be a finite number > 0",
        ),
        (
            "client=checkin,privacy.checkin_probability=nan",
            "privacy.checkin_probability=nan must be a finite number in (0, 1]",
        ),
        ("round_timeout=inf", "round_timeout=inf must be a finite number > 0 (seconds)"),
        ("client.lr=inf", "client.lr=inf must be a finite number > 0"),
        ("client.lr=nan", "client.lr=nan must be a finite number > 0"),
        ("strategy.server_lr=-inf", "strategy.server_lr=-inf must be a finite number > 0"),
        (
            "partition=dirichlet,partition.alpha=inf",
            "partition.alpha=inf must be a finite number > 0",
        ),
        # any other float of the composed config, named by its path
        (
            "aggregator=secaggplus,aggregator.stage_timeout=inf",
            "aggregator.stage_timeout=inf must be a finite number",
        ),
        ("+client.extra.deep=nan", "client.extra.deep=nan must be a finite number"),
    ],
)
def test_non_finite_config_value_is_refused_naming_the_field(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        prepare(_cfg(override.split(",")))
    assert str(info.value) == message


def test_cli_refuses_infinite_max_grad_norm_with_one_line(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedpriv.cli.experiment",
            "privacy.max_grad_norm=inf",
            f"hydra.run.dir={out}",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert lines == ["fedpriv: error: privacy.max_grad_norm=inf must be a finite number > 0"]
    assert not (out / "results.json").exists()


# ---- item 4: a non-finite update is never summed ------------------------------------------
def _reply(update: dict[str, np.ndarray], metrics: dict[str, float] | None = None) -> Message:
    content = RecordDict(
        {
            UPDATE_KEY: ArrayRecord({k: torch.from_numpy(v) for k, v in update.items()}),
            METRICS_KEY: MetricRecord(metrics or {"noise_draws": 1.0}),
        }
    )
    return Message(content=content, dst_node_id=1, message_type=MessageType.TRAIN)


def _messages(n: int) -> list[Message]:
    """``n`` node-per-client train messages (what the aggregator counts as expected clients)."""
    return node_messages(list(range(1, n + 1)), {"w": np.zeros(2)}, 1)


class _Grid:
    """Stands in for Flower's Grid: ``send_and_receive`` answers with prepared replies."""

    def __init__(self, replies: list[Message]) -> None:
        self.replies = replies

    def send_and_receive(self, messages: list[Message], timeout: float) -> list[Message]:
        assert len(messages) == len(self.replies)
        return list(self.replies)


def test_ideal_aggregator_drops_non_finite_updates_and_says_so() -> None:
    good = {"w": np.array([1.0, 2.0]), "b": np.array([0.5])}
    other = {"w": np.array([3.0, -1.0]), "b": np.array([0.25])}
    nan = {"w": np.array([np.nan, 2.0]), "b": np.array([0.5])}
    inf = {"w": np.array([1.0, 2.0]), "b": np.array([-np.inf])}
    replies = [_reply(good), _reply(nan), _reply(other), _reply(inf)]
    result = IdealAggregator().sum_updates(_Grid(replies), _messages(4), server_round=1, timeout=1)
    assert result.num_clients == 2 and result.dropped == {NON_FINITE: 2}
    np.testing.assert_array_equal(result.total["w"], [4.0, 1.0])  # exact: small floats
    np.testing.assert_array_equal(result.total["b"], [0.75])
    assert result.metrics == {"noise_draws": 2.0}  # only the contributors' metrics
    assert dropped_note(4, result) == "2 clients dropped: non-finite update"


def test_all_non_finite_fails_the_round() -> None:
    replies = [_reply({"w": np.array([np.nan])}), _reply({"w": np.array([np.inf])})]
    with pytest.raises(RoundFailed) as info:
        IdealAggregator().sum_updates(_Grid(replies), _messages(2), server_round=3, timeout=1)
    assert info.value.num_ok == 0 and "non-finite" in str(info.value)


def test_dropped_note_names_reasons() -> None:
    full = AggregateResult({}, 5)
    assert dropped_note(5, full) == ""
    assert dropped_note(5, AggregateResult({}, 4, dropped={NON_FINITE: 1})) == (
        "1 client dropped: non-finite update"
    )
    assert dropped_note(5, AggregateResult({}, 3)) == "2 clients dropped: no reply"
    assert dropped_note(5, AggregateResult({}, 2, dropped={NON_FINITE: 1})) == (
        "3 clients dropped: 1 non-finite update, 2 no reply"
    )


@dataclass(frozen=True, kw_only=True)
class NoDegradedSpec(DPSGDSpec):
    """A spec that cannot account a round with dropouts (the base class's default)."""

    def degraded_round_events(self, contributors: int) -> EventRuns:
        raise UnaccountableRound(f"cannot account a round with {contributors} clients")


@dataclass(frozen=True)
class NoDegradedEvents(ClientAlgorithm):
    """A client algorithm stating no normalizer (the base class's default)."""

    privacy: DPSGDSpec = DPSGDSpec(num_clients=2)

    def train(
        self, model: nn.Module, data: ClientData, ctx: TrainContext
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        raise AssertionError("not called")


class _Recorder:
    def __init__(self) -> None:
        self.rounds: list[dict[str, Any]] = []
        self.out_dir = Path("/nonexistent")
        self.extra: dict[str, Any] = {}  # results.json's other blocks (``engine``)

    def log_round(self, row: dict[str, Any]) -> None:
        self.rounds.append(row)

    def update_privacy(self, **values: Any) -> None:
        pass


class _Display:
    def row(self, row: dict[str, Any]) -> None:
        pass

    def note(self, text: str) -> None:
        pass


class _OneRoundAggregator(Aggregator):
    def __init__(self, result: AggregateResult) -> None:
        self.result = result

    def sum_updates(self, grid: Any, messages: Any, *, server_round: int, timeout: float) -> Any:
        r = self.result
        return AggregateResult(dict(r.total), r.num_clients, dict(r.metrics), dict(r.dropped))


def _job(algorithm: Any, result: AggregateResult, plan: RunPlan) -> ServerJob:
    plan = plan.with_privacy(algorithm.privacy)
    privacy = RunPrivacy(plan.privacy, plan.cohort.nominal_size)
    log = RoundLog(privacy, _Recorder(), _Display(), None, False)  # type: ignore[arg-type]
    aggregator = _OneRoundAggregator(result)
    return ServerJob(plan, algorithm, aggregator, run_layout(plan), log)


@pytest.fixture(scope="module")
def run_cfg() -> RunPlan:
    plan, _ = prepare(_cfg([*TINY, "num_rounds=1"]))
    return plan


class _NodeGrid:
    def get_node_ids(self) -> list[int]:
        return [11, 12]


def test_round_without_degraded_events_fails_unreleased(run_cfg: RunPlan) -> None:
    total = {"weight": np.ones((10, 64)), "bias": np.ones(10)}
    result = AggregateResult(total, 1, dropped={NON_FINITE: 1})
    spec = NoDegradedSpec(noise_multiplier=1.0, num_clients=2, steps=2, normalizer=1.0)
    job = _job(LocalDPSGD(steps=2, normalizer=1.0, privacy=spec), result, run_cfg)
    start = job.initial_state()
    final = DPFedAvg().start(_NodeGrid(), job)  # type: ignore[arg-type]
    [row] = job.log.recorder.rounds
    assert row["status"] == "failed" and "1 client dropped: non-finite update" in row["message"]
    assert job.privacy.rounds == 0 and job.privacy.epsilon() == 0.0  # nothing accounted
    for key, value in start.items():
        np.testing.assert_array_equal(final[key], value)  # nothing released


def test_degraded_round_accounts_survivors_and_mean_divides_by_num_clients(
    run_cfg: RunPlan,
) -> None:
    _, algorithm = prepare(_cfg([*TINY, "num_rounds=1"]))
    start_job = _job(algorithm, AggregateResult({}, 2), run_cfg)
    shapes = {k: v.shape for k, v in start_job.initial_state().items()}
    total = {k: np.full(s, 0.5) for k, s in shapes.items()}
    job = _job(algorithm, AggregateResult(total, 1, dropped={NON_FINITE: 1}), run_cfg)
    start = job.initial_state()
    final = DPFedAvg().start(_NodeGrid(), job)  # type: ignore[arg-type]
    [row] = job.log.recorder.rounds
    assert row["status"] == "ok" and row["clients_dropped"] == 1
    assert row["dropped"] == "1 client dropped: non-finite update"
    for key, value in start.items():  # the PUBLIC num_clients=2 divides, not the 1 survivor
        np.testing.assert_allclose(final[key], value + 0.5 / 2, rtol=0, atol=1e-7)
    spec = algorithm.privacy.accounting
    degraded = spec.epsilon(algorithm.privacy.degraded_round_events(1))
    assert row["epsilon"] == pytest.approx(degraded, rel=1e-12)
    assert degraded > spec.epsilon(algorithm.privacy.round_events())  # half the noise: larger ε


# ---- end to end: a plug-in client whose partition 0 sends NaN ------------------------------
@dataclass(frozen=True)
class NaNForPartition0(LocalDPSGD):
    """Local DP-SGD whose client 0 returns a NaN update (a diverged or broken client)."""

    def train(
        self, model: nn.Module, data: ClientData, ctx: TrainContext
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        update, metrics = super().train(model, data, ctx)
        if data.partition_id == 0:
            update = {k: torch.full_like(v, math.nan) for k, v in update.items()}
        return update, metrics


@pytest.mark.slow
def test_nan_client_is_dropped_and_round_accounted_with_survivors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides = [*TINY, "num_rounds=2", "client._target_=tests.test_core_seams.NaNForPartition0"]
    summary = run_experiment(_cfg(overrides), tmp_path)
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["status"] == "complete" and summary["status"] == "complete"
    weights = np.load(tmp_path / "model.npz")
    assert all(np.isfinite(weights[k]).all() for k in weights.files)
    assert [r["clients_dropped"] for r in res["rounds"]] == [1, 1]
    assert [r["dropped"] for r in res["rounds"]] == ["1 client dropped: non-finite update"] * 2
    assert all(math.isfinite(r["loss"]) for r in res["rounds"])
    _, algorithm = prepare(_cfg(overrides))
    spec = algorithm.privacy.accounting
    expected = spec.epsilon(algorithm.privacy.degraded_round_events(1) * 2)  # 2 rounds, 1 left
    assert res["privacy"]["epsilon"] == pytest.approx(expected, rel=1e-9)
    assert res["privacy"]["epsilon"] > spec.epsilon(algorithm.privacy.round_events() * 2)
    out = capsys.readouterr().out
    assert out.count("1 client dropped: non-finite update") == 2
    # item 7 in results.json and the header
    assert res["privacy"]["noise_source"] == "seeded"
    assert res["privacy"]["float_noise_hardened"] is False
    assert res["privacy"]["non_private"] is False
    assert "normalizer" in res["privacy"]
    assert "noise_source=seeded (not hardened against floating-point attacks)" in out


@pytest.mark.slow
def test_noise_multiplier_zero_warns_and_marks_run_non_private(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides = [*TINY, "num_rounds=1", "privacy.noise_multiplier=0", "privacy.secure_mode=true"]
    summary = run_experiment(_cfg(overrides), tmp_path)
    res = json.loads((tmp_path / "results.json").read_text())
    assert summary["status"] == "complete"
    assert res["privacy"]["non_private"] is True
    assert res["privacy"]["epsilon"] == "inf"  # σ=0: the accountant's ε is unbounded
    assert res["privacy"]["noise_source"] == "secure"
    captured = capsys.readouterr()
    warnings = [ln for ln in captured.err.splitlines() if "NON-PRIVATE" in ln]
    assert warnings == [
        "fedpriv: warning: privacy.noise_multiplier=0 adds no noise: this run is NON-PRIVATE"
    ]
    header = next(ln for ln in captured.out.splitlines() if "fedpriv:" in ln)
    assert header.startswith("NON-PRIVATE run (privacy.noise_multiplier=0): fedpriv: 2 clients")
    assert "noise_source=secure" in header


# ---- item 7: noise source, hardening, normalizer (unit) ------------------------------------
def test_noise_facts_and_header_line(run_cfg: RunPlan) -> None:
    _, algorithm = prepare(_cfg([*TINY, "num_rounds=1"]))
    facts = noise_facts(algorithm)
    assert facts["noise_source"] == NoiseSource.SEEDED
    assert facts["float_noise_hardened"] is False and facts["non_private"] is False
    secure_spec = replace(algorithm.privacy, secure_mode=True)
    secure = noise_facts(replace(algorithm, privacy=secure_spec))
    assert secure["noise_source"] == NoiseSource.SECURE
    facts = {**facts, "normalizer": 64.0}
    line = header_line(run_cfg, facts, "pld", Path("/tmp/out"))
    assert line.startswith(
        "fedpriv: 2 clients, 1 rounds, σ=1.2, δ=1e-05 (add_remove), accounting=pld, "
    )
    assert "noise_source=seeded (not hardened against floating-point attacks)" in line
    assert "normalizer=64;" in line and "NON-PRIVATE" not in line


def test_skellam_declares_hardened_noise_and_float_clients_do_not() -> None:
    from clients.checkin_clients import CheckinClient
    from clients.generalized_dpsgd import GeneralizedDPSGD
    from clients.skellam_dpsgd import SkellamDPSGD

    assert SkellamDPSGD.hardened_noise is True
    assert LocalDPSGD.hardened_noise is False and CheckinClient.hardened_noise is False
    # batch clipping: float noise unless secure mode with Poisson batches and RDP (lattice)
    assert GeneralizedDPSGD().hardened_noise is False


def test_normalizer_default_raises_naming_the_class() -> None:
    with pytest.raises(NotImplementedError, match="NoDegradedEvents does not state"):
        _ = NoDegradedEvents().normalizer


# ---- item 8: group sizes, enums, capabilities ---------------------------------------------
def test_group_sizes_are_a_setting_of_the_batch_clipping_family_only() -> None:
    from fedpriv.run.config import check_known_keys

    with pytest.raises(Exception, match="group_sizes"):  # the dpsgd schema has no such key
        _cfg([*TINY, "privacy.group_sizes=[1,2]"])
    with pytest.raises(ConfigError) as info:
        check_known_keys(_cfg([*TINY, "+privacy.group_sizes=[1,2]"]))
    assert str(info.value).startswith(
        "privacy.group_sizes=[1, 2] is not a setting of privacy=dpsgd (its keys: "
    )


def test_batch_clipping_accepts_group_sizes() -> None:
    overrides = [o for o in TINY if not o.startswith("client.")]
    _, algorithm = prepare(_cfg([*overrides, "client=batch_clipping", "privacy.group_sizes=[1,2]"]))
    assert tuple(algorithm.privacy.group_sizes) == (1, 2)
    assert {"epsilon_g1", "epsilon_g2"} <= set(algorithm.privacy.report(1))


def test_accountant_and_conversion_are_enums() -> None:
    with pytest.raises(ConfigError) as info:
        prepare(_cfg([*TINY, "privacy.accountant=pdl"]))
    assert str(info.value) == "privacy.accountant='pdl' must be one of: pld, rdp"
    with pytest.raises(ConfigError) as info:
        prepare(_cfg([*TINY, "privacy.conversion=mironov"]))
    assert "needs privacy.accountant=rdp" in str(info.value)
    plan, algorithm = prepare(_cfg([*TINY, "privacy.accountant=rdp", "privacy.conversion=mironov"]))
    spec = plan.privacy
    assert spec.accountant is Accountant.RDP and spec.conversion is Conversion.MIRONOV


@dataclass
class IntegerOnlyAggregator(IdealAggregator):
    """A plug-in aggregator that declares it needs integer updates (its name says nothing)."""

    requires_integer_updates = True
    bits: int = 32


def test_declared_capability_not_target_name_decides() -> None:
    target = "aggregator._target_=tests.test_core_seams.IntegerOnlyAggregator"
    with pytest.raises(ConfigError) as info:
        prepare(_cfg([*TINY, target, "+aggregator.bits=32"]))
    assert "IntegerOnlyAggregator=needs a client algorithm that sends integers" in str(
        info.value
    ).replace("aggregator='IntegerOnlyAggregator' ", "IntegerOnlyAggregator=")
    assert aggregator_class(
        {"_target_": "strategies.secaggplus.SecAggPlusAggregator"}
    ).uses_secagg_mods
    assert not aggregator_class(
        {"_target_": "fedpriv.run.aggregation.IdealAggregator"}
    ).uses_secagg_mods


def test_min_replies_counts_finite_updates_only() -> None:
    replies = [_reply({"w": np.array([1.0])}), _reply({"w": np.array([np.nan])})]
    with pytest.raises(RoundFailed, match="1/2 finite updates"):
        IdealAggregator(min_replies=2).sum_updates(
            _Grid(replies), _messages(2), server_round=1, timeout=1
        )
    result = IdealAggregator(min_replies=1).sum_updates(
        _Grid(replies), _messages(2), server_round=1, timeout=1
    )
    assert result.num_clients == 1 and result.dropped == {NON_FINITE: 1}


def test_noise_beyond_double_precision_is_a_config_error() -> None:
    """A finite but absurd sigma overflows the accountant: one line naming the field."""
    with pytest.raises(ConfigError, match=r"privacy.noise_multiplier=1e\+300 is outside"):
        prepare(_cfg(["privacy.noise_multiplier=1e300", "model=logistic", "num_rounds=1"]))
