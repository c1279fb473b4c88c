"""The check-in spec (issue 11): one object for the run and `fedpriv-account checkin`.

Items covered: 5 (every CLI input is an answer or one line with exit 2, no overflow for a huge
eps0), 6 (which bound answered and why), 1 for check-ins (the report each client sends, read
back from Flower's protobuf serialization, carries the noise its randomizer claims and is
divided by no data-dependent quantity), 2 for check-ins (calibration honours the run's
accounting settings) and the contract additions (`noise_draws`, no group privacy).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict
from flwr.supercore.task_identity import TaskIdentity

from clients.checkin_clients import (
    CheckinClient,
    CheckinGaussianClient,
    mean_cross_entropy,
    slot_update,
)
from fedpriv.accounting.checkin.events import LOCAL_CAP
from fedpriv.accounting.checkin.spec import RUN_VARIANTS, CheckinSpec
from fedpriv.accounting.loss_models.local_randomizer import calibrated_randomizer, release_event
from fedpriv.accounting.samplers.checkin import delta0_bound
from fedpriv.cli.account import main
from fedpriv.common.errors import ConfigError
from fedpriv.common.wire import CONFIG_KEY, METRICS_KEY, MODEL_KEY, UPDATE_KEY
from fedpriv.mechanisms.checkin_draw import CheckinVariant
from fedpriv.mechanisms.noise import make_generator
from fedpriv.mechanisms.randomizers import RandomizerKind
from fedpriv.run.algorithm import PrivacyUnit
from fedpriv.run.config import compose_config
from fedpriv.run.prepare import prepare
from fedpriv.run.run_privacy import RunPrivacy

REPO = Path(__file__).resolve().parents[1]
BASE = ["client=checkin", "privacy=checkin", "strategy=checkin", "model=logistic"]


def _cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["checkin", *args])
    return rc, out.getvalue(), err.getvalue()


# --------------------------------------------------------------------------- item 5
def test_issue_command_answers_with_the_local_cap() -> None:
    rc, out, err = _cli(
        "variant=fixed",
        "local_epsilon=800",
        "local_delta=1e-8",
        "num_clients=1000",
        "num_slots=100",
        "target_delta=1e-6",
        "--json",
    )
    assert rc == 0, err
    res = json.loads(out)
    # the (eps0, delta0) precondition holds for no delta1 at eps0 = 800 (delta0 bound
    # underflows to 0), so one report per pass at (800, 1e-8) <= target_delta answers
    assert res["epsilon"] == 800.0 and res["bound"] == LOCAL_CAP
    assert "precondition" in res["bound_reason"] and "Theorem 3.2" in res["bound_reason"]


E0 = ["1e-6", "0.1", "1", "300", "500", "709", "710", "800", "1e4"]
GRID = [(v, e0, "0") for v in [*RUN_VARIANTS, "shuffle"] for e0 in E0] + [
    (v, e0, "1e-8")
    for v in [*RUN_VARIANTS, "shuffle"]
    for e0 in ["5", "300", "709", "710", "800", "1e4"]
]


@pytest.mark.parametrize(("variant", "e0", "d0"), GRID)
def test_cli_grid_answers_within_the_cap_or_one_line(variant: str, e0: str, d0: str) -> None:
    reps = 2
    rc, out, err = _cli(
        f"variant={variant}",
        f"local_epsilon={e0}",
        f"local_delta={d0}",
        "num_clients=1000",
        "num_slots=100",
        "target_delta=1e-6",
        f"repetitions={reps}",
        "--json",
    )
    if rc == 2:
        assert out == "" and err.count("\n") == 1 and err.startswith("fedpriv-account: error:")
        return
    assert rc == 0 and err == ""
    res = json.loads(out)
    eps = res["epsilon"]
    # each client sends at most one report per pass (poisson: at most one per step)
    reports = reps * (100 if variant == "poisson" else 1)
    assert isinstance(eps, float) and math.isfinite(eps) and 0.0 <= eps
    assert eps <= reports * float(e0) * (1 + 1e-12)
    if res["bound"] == LOCAL_CAP:
        assert res["bound_reason"]  # the theorem did not answer: say why


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["local_epsilon=inf"], "local_epsilon"),
        (["local_epsilon=nan"], "local_epsilon"),
        (["local_epsilon=1e400"], "local_epsilon"),
        (["num_clients=inf"], "num_clients"),
        (["local_delta=0.5"], "local_delta"),  # precondition fails and delta0 > target_delta
        (["local_delta=1e-7", "repetitions=100"], "num_rounds"),  # 100 delta0 > target_delta
        (["randomizer=uniform"], "randomizer"),
        (["randomizer=laplace", "local_delta=1e-9"], "local_delta"),
        (["clipping_norm=inf"], "clipping_norm"),
        (["variant=poisson", "slot_sample_rate=2"], "slot_sample_rate"),
        (["variant=fixed", "slot_sample_rate=0.1"], "slot_sample_rate"),
        (["variant=poisson", "client_sample_rate=0.1"], "client_sample_rate"),  # renamed
    ],
)
def test_cli_bad_input_is_one_line_exit_2(args: list[str], key: str) -> None:
    base = {"variant": "fixed", "local_epsilon": "800", "num_clients": "1000"}
    base.update({"num_slots": "100", "target_delta": "1e-6"})
    for a in args:
        k, _, v = a.partition("=")
        base[k] = v
    rc, out, err = _cli(*(f"{k}={v}" for k, v in base.items()))
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"fedpriv-account: error: {key}="), err
    if key == "client_sample_rate":
        assert "was renamed: use slot_sample_rate" in err


def test_delta0_bound_in_log_space_matches_the_formula_and_never_raises() -> None:
    # (1 - e^-e0) d1 / (4 e^e0 (2 + ln(2/d1) / ln(1/(1 - e^{-5 e0})))) at e0 = 1, d1 = 1e-6
    e0, d1 = 1.0, 1e-6
    direct = (
        (1 - math.exp(-e0))
        * d1
        / (4 * math.exp(e0) * (2 + math.log(2 / d1) / math.log(1 / (1 - math.exp(-5 * e0)))))
    )
    assert delta0_bound(e0, d1) == pytest.approx(direct, rel=1e-12)
    for big in (300.0, 500.0, 709.0, 710.0, 800.0, 1e4):
        assert delta0_bound(big, 0.5) == 0.0  # below the smallest double, not an error


# --------------------------------------------------------------------------- item 6
def test_averaged_with_target_delta_equal_to_delta2_says_why() -> None:
    args = ["variant=averaged", "num_clients=10000", "num_slots=1000", "--json"]
    rc, out, _ = _cli(*args, "local_epsilon=0.05", "delta2=1e-6", "target_delta=1e-6")
    res = json.loads(out)
    assert rc == 0 and res["epsilon"] == 0.05 and res["bound"] == LOCAL_CAP
    assert res["bound_reason"].startswith("Theorem 4.1 needs target_delta > delta2 = 1e-06")
    # with room for delta2 the theorem answers, below eps0, and no reason is given
    rc, out, _ = _cli(*args, "local_epsilon=0.05", "delta2=1e-7", "target_delta=1e-6")
    res = json.loads(out)
    assert rc == 0 and res["bound"] == "Theorem 4.1" and "bound_reason" not in res
    assert res["epsilon"] < 0.05


def test_run_summary_names_the_bound_and_matches_the_ledger() -> None:
    spec = CheckinSpec(
        variant="fixed",
        local_epsilon=2.0,
        target_delta=1e-6,
        num_slots=100,
        num_clients=1000,
        num_rounds=3,
    )
    algo = CheckinClient(num_slots=100, privacy=spec)  # a spec bound to a run (3 passes)
    summary = algo.privacy_summary()
    assert summary["normalizer"] == 1.0 and summary["bound"] == LOCAL_CAP
    assert summary["bound_reason"].startswith("Theorem 3.2 gives")
    run = RunPrivacy(algo.privacy, 1000)
    for _ in range(3):
        run.record_round()
    assert run.epsilon() == 6.0 == algo.privacy.bound_after(3).epsilon  # 3 passes x eps0
    small = CheckinClient(num_slots=100, privacy=dataclasses.replace(spec, local_epsilon=0.1))
    s = small.privacy_summary()
    assert s["bound"] == "Theorem 3.2" and "bound_reason" not in s


def test_cli_prints_the_runs_epsilon() -> None:
    spec = CheckinSpec(
        variant="fixed",
        local_epsilon=0.3,
        checkin_probability=0.5,
        target_delta=1e-6,
        num_slots=200,
        num_clients=5000,
        num_rounds=4,
    )
    run = RunPrivacy(spec, 5000)
    for _ in range(4):
        run.record_round()
    rc, out, _ = _cli(
        "variant=fixed",
        "local_epsilon=0.3",
        "checkin_probability=0.5",
        "num_clients=5000",
        "num_slots=200",
        "repetitions=4",
        "target_delta=1e-6",
        "--json",
    )
    assert rc == 0 and json.loads(out)["epsilon"] == run.epsilon()  # same object, same number


# --------------------------------------------------------------------------- item 2
@pytest.mark.parametrize(
    ("accountant", "conversion"), [("pld", "default"), ("rdp", "default"), ("rdp", "mironov")]
)
@pytest.mark.parametrize("variant", ["fixed", "averaged", "sliding-window", "poisson"])
def test_calibration_meets_the_target_within_one_percent(
    variant: str, accountant: str, conversion: str
) -> None:
    spec = CheckinSpec(
        variant=variant,
        local_epsilon=None,
        target_epsilon=0.5,
        target_delta=1e-6,
        accountant=accountant,
        conversion=conversion,
        num_slots=50,
        num_clients=500,
        num_rounds=3,
    )
    algo = CheckinClient(variant=variant, num_slots=50, privacy=spec)
    cal = algo.calibrated(3)  # the run's path: the spec calibrated to its target
    assert cal.privacy is not spec and cal.privacy.calibrated_from_target_epsilon == 0.5
    assert cal.privacy.target_epsilon is None and cal.privacy.local_epsilon is not None
    run = RunPrivacy(cal.privacy, 500)
    for _ in range(3):
        run.record_round()
    eps = run.epsilon()
    assert 0.99 * 0.5 <= eps <= 0.5
    assert cal.privacy.accountant == accountant


def test_calibration_refuses_non_finite_targets() -> None:
    spec = CheckinSpec(variant="fixed", local_epsilon=1.0, num_slots=50, num_clients=500)
    for bad in (math.inf, math.nan, 0.0):
        with pytest.raises(ConfigError, match=r"^privacy\.target_epsilon="):
            spec.calibrated(bad, 3)


def test_cli_calibrates_local_epsilon() -> None:
    rc, out, _ = _cli(
        "variant=sliding-window",
        "num_clients=1000",
        "num_slots=100",
        "target_epsilon=0.5",
        "target_delta=1e-6",
        "repetitions=2",
        "--json",
    )
    res = json.loads(out)
    assert rc == 0 and res["calibrated"] == "local_epsilon"
    assert 0.495 <= res["epsilon"] <= 0.5


# --------------------------------------------------------------------------- spec
def test_spec_refuses_non_finite_values_naming_the_field() -> None:
    base = dict(variant="fixed", local_epsilon=1.0, num_clients=100, num_slots=10)
    for name, value, field in [
        ("local_epsilon", math.nan, "privacy.local_epsilon"),
        ("local_epsilon", math.inf, "privacy.local_epsilon"),
        ("clipping_norm", math.inf, "privacy.clipping_norm"),
        ("checkin_probability", math.nan, "privacy.checkin_probability"),
        ("randomizer", "uniform", "client.randomizer"),
    ]:
        with pytest.raises(ConfigError) as info:
            CheckinSpec(**{**base, name: value})
        assert str(info.value).startswith(field + "=") and "\n" not in str(info.value)
    # shuffle is an analysis of fedpriv-account only: the client refuses to run it
    with pytest.raises(ConfigError) as info:
        CheckinClient(variant="shuffle")
    message = str(info.value)
    assert message.startswith("client.variant=") and "fedpriv-account only" in message
    spec = CheckinSpec(**base, target_delta=1e-6)
    assert spec.accounting.neighboring_relation == "replace_one"  # the paper's relation
    assert spec.variant is CheckinVariant.FIXED and spec.variant == "fixed"


def test_local_release_event_gaussian_is_exact_gdp() -> None:
    r = calibrated_randomizer(RandomizerKind.GAUSSIAN, 1.0, 1.0, 1e-6)
    ev = release_event(r)
    # one release of the analytic-Gaussian randomizer is exactly (eps0, delta0)-DP
    assert ev.delta(1.0) == pytest.approx(1e-6, rel=1e-6)
    assert ev.epsilon(1e-6) == pytest.approx(1.0, rel=1e-6)
    # huge eps0 (Laplace): basic composition instead of an enormous PLD grid
    big = release_event(calibrated_randomizer("laplace", 1.0, 800.0, 0.0))
    assert big.epsilon(1e-6, 3) == pytest.approx(2400.0)


def test_contract_flags() -> None:
    """Check-in clients declare what they are; group privacy is not computed for check-ins:
    ``privacy.group_sizes`` is not a setting of privacy=checkin (refused, naming its keys)."""
    for cls in (CheckinClient, CheckinGaussianClient):
        assert cls.checks_in is True and cls.privacy_unit is PrivacyUnit.CLIENT
    with pytest.raises(ConfigError) as info:
        prepare(compose_config([*BASE, "+privacy.group_sizes=[2]"]))
    assert str(info.value).startswith("privacy.group_sizes=")
    assert "is not a setting of privacy=checkin (its keys: " in str(info.value)


# --------------------------------------------------------------------------- item 1
@pytest.fixture()
def task_identity():
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


def _cfg(overrides: list[str]):
    return compose_config([*BASE, *overrides])


def _wire(content: RecordDict) -> RecordDict:
    """The bytes Flower sends, parsed back (protobuf serde of the reply's RecordDict)."""
    data = recorddict_to_proto(content).SerializeToString()
    proto = ProtoRecordDict()
    proto.ParseFromString(data)
    return recorddict_from_proto(proto)


@pytest.mark.parametrize("randomizer", ["gaussian", "laplace"])
def test_sent_report_has_the_claimed_noise_and_no_data_dependent_divisor(
    shared_data: Path, task_identity: None, randomizer: str
) -> None:
    extra = ["privacy.local_delta=1e-6"] if randomizer == "gaussian" else []
    plan, algo = prepare(
        _cfg(
            [
                "num_clients=20",
                "partition=dirichlet",
                "partition.alpha=0.05",
                "client.variant=poisson",  # no check-in state to set up; same report path
                f"client.randomizer={randomizer}",
                "privacy.clipping_norm=0.5",
                "privacy.local_epsilon=2.0",
                *extra,
            ]
        )
    )
    from fedpriv.run.client_app import client_data
    from fedpriv.run.setup import build_model_for

    model = build_model_for(plan)
    arrays = ArrayRecord({k: v.detach() for k, v in model.state_dict().items()})
    r = algo.privacy.local_randomizer
    noise_parts, sizes = [], []
    for pid in range(0, 20, 2):
        data = client_data(plan.to_payload(), pid)
        sizes.append(len(data))
        # the clipped gradient of the client's mean loss, computed here independently
        model.zero_grad()
        mean_cross_entropy(model(data.x), data.y).backward()
        grads = {k: p.grad.detach().double() for k, p in model.named_parameters()}
        if randomizer == "gaussian":
            norm = math.sqrt(sum(float((g**2).sum()) for g in grads.values()))
        else:
            norm = sum(float(g.abs().sum()) for g in grads.values())
        clipped = {k: g * min(1.0, 0.5 / norm) for k, g in grads.items()}
        for slot in range(1, 6):
            msg = Message(
                content=RecordDict(
                    {
                        MODEL_KEY: arrays,
                        CONFIG_KEY: ConfigRecord({"server_round": 1, "slot": slot}),
                    }
                ),
                dst_node_id=pid + 1,
                message_type=MessageType.TRAIN,
            )
            reply = _wire(slot_update(algo, plan, msg, pid, 1, slot).content)
            sent = reply.array_records[UPDATE_KEY].to_torch_state_dict()
            metrics = reply.metric_records[METRICS_KEY]
            local = algo.privacy.local_events()
            assert metrics["noise_draws"] == sum(c for _, c in local) == 1
            noise = {k: sent[k].double() - clipped[k] for k in clipped}
            # the noise is exactly the randomizer's draw from the report's seed: the report is
            # clip(g) + noise, divided by nothing (no len(data), no sample rate)
            rng = np.random.default_rng([plan.seed, 1, slot, pid])
            gen = make_generator(int(rng.integers(2**62)), secure_mode=False)
            expect = r.noise({k: tuple(t.shape) for k, t in clipped.items()}, gen)
            for k in clipped:
                assert torch.allclose(noise[k], expect[k].double(), atol=1e-5, rtol=0)
            noise_parts.append(torch.cat([noise[k].flatten() for k in sorted(noise)]))
    assert max(sizes) > 5 * min(sizes)  # dirichlet alpha = 0.05: very unequal clients
    z = torch.cat(noise_parts) / r.sensitivity  # noise in units of the sensitivity 2L
    n = z.numel()
    claimed = release_event(r).noise_multiplier
    if randomizer == "gaussian":
        # sample std of N Gaussians: relative standard error 1/sqrt(2N); allow 6 of them
        assert float(z.std()) == pytest.approx(claimed, rel=6 / math.sqrt(2 * n))
    else:
        # Laplace(b): E|X| = b, sd|X| = b; relative standard error 1/sqrt(N); allow 6
        assert float(z.abs().mean()) == pytest.approx(claimed, rel=6 / math.sqrt(n))
    assert n >= 20_000
    assert algo.privacy_summary()["normalizer"] == algo.normalizer == 1.0


# --------------------------------------------------------------------------- import direction
def _imports(path: Path) -> set[str]:
    import ast

    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):  # module level and inside functions
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_imports_go_one_way() -> None:
    core = [
        "fedpriv/mechanisms/checkin_draw.py",
        "fedpriv/mechanisms/randomizers.py",
        "fedpriv/accounting/samplers/checkin.py",
        "fedpriv/accounting/accountants/composition.py",
        "fedpriv/accounting/checkin/events.py",
        "fedpriv/accounting/checkin/spec.py",
        "fedpriv/accounting/checkin/gaussian.py",
        "fedpriv/accounting/loss_models/local_randomizer.py",
    ]
    for rel in core:
        bad = {m for m in _imports(REPO / rel) if m.split(".")[0] in ("clients", "strategies")}
        assert not bad, (rel, bad)
    for rel in core[:2]:  # the mechanisms layer draws; it never imports the accounting
        bad = {m for m in _imports(REPO / rel) if m.startswith("fedpriv.accounting")}
        assert not bad, (rel, bad)
    server = _imports(REPO / "strategies/checkin_server.py")
    assert not {m for m in server if m.split(".")[0] == "clients"}
    assert {"fedpriv.common.wire", "fedpriv.accounting.checkin.spec"} <= server
    client = _imports(REPO / "clients/checkin_clients.py")
    assert {
        "fedpriv.mechanisms.checkin_draw",
        "fedpriv.mechanisms.randomizers",
        "fedpriv.accounting.checkin.spec",
    } <= client
    assert not (REPO / "fedpriv/accounting/checkin.py").exists()  # split by concept
