"""Checkpoint and resume (``fedpriv resume=RUN_DIR``): a killed run continues to the same
model, bit for bit, and the same ε as the run that was never interrupted.

Most runs here use an in-process Flower grid: the real strategy, runner, recorder and the
real worker handler (:func:`fedpriv.run.client_app.worker_train_handler`), without Ray, so a
process costs no Ray start-up. The kill test starts each run in a process of its own
(``multiprocessing`` forkserver, modules preloaded) and kills it with SIGKILL at a random
moment, then resumes it in this process. One slow test kills the real ``fedpriv`` command
(Flower's simulation engine on Ray) and resumes it with ``fedpriv resume=RUN_DIR``.

The run (4 clients, logistic model, client-level DP-FedAvg with adaptive clipping, FedAdam on
the server, 10 rounds) carries every kind of state a checkpoint holds: model, server optimizer
moments, the round config (the adaptive clip norm), the ledger and the rows.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from fedpriv.common.errors import ConfigError
from fedpriv.run import checkpoint, resume
from fedpriv.run.config import conf_dir, register_schema
from fedpriv.run.plan import RunPlan
from fedpriv.run.run_privacy import RunPrivacy
from strategies.fedavg import DPFedAvg

REPO = Path(__file__).resolve().parents[1]
ROUNDS = 10
BASE = [
    "client=client_level",
    "privacy=client_level",
    "num_clients=4",
    "model=logistic",
    "client.target_unclipped_quantile=0.5",
    "privacy.count_noise_multiplier=2.0",
    "client.batch_size=500",  # 3 local steps per client and round
    "privacy.accountant=rdp",  # Gaussian RDP: fast, so a run takes about 2 s
    "progress=false",
    "plot=false",
    "num_workers=2",
    "strategy.server_optimizer=fedadam",
]


#: Record-level local DP-SGD (async FedAvg refuses client-level DP); full batches keep the
#: accountant fast (no subsampling).
RECORD_LEVEL = [
    "num_clients=4",
    "model=logistic",
    "client.steps=2",
    "privacy.sample_rate=1.0",
    "progress=false",
    "plot=false",
    "num_workers=2",
    "strategy=async_fedavg",
    "strategy.max_staleness=2",
    "strategy.server_optimizer=fedavgm",
]


def _cfg(overrides: list[str] | tuple[str, ...] = ()) -> Any:
    register_schema()
    base = [] if "strategy=async_fedavg" in overrides else BASE
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose(config_name="config", overrides=[*base, f"num_rounds={ROUNDS}", *overrides])


class InProcessGrid:
    """Flower's grid for ``num_nodes`` worker nodes, in this process (the plan travels as the
    workers' payload)."""

    def __init__(self, plan: RunPlan, num_nodes: int) -> None:
        self.plan_json = plan.to_payload()
        self.ids = [1000 + i for i in range(num_nodes)]

    def get_node_ids(self) -> list[int]:
        return list(self.ids)

    def send_and_receive(self, messages: list[Any], timeout: float | None = None) -> list[Any]:
        from fedpriv.run.client_app import worker_train_handler

        return [worker_train_handler(self.plan_json, m) for m in messages]


def _in_process(set_attr: Any) -> None:
    """Make ``run_experiment`` run its server app on :class:`InProcessGrid` (no Ray)."""
    from flwr.supercore.task_identity import TaskIdentity

    from fedpriv.run import runner

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0

    def simulate(server_app: Any, client_app: Any, num_nodes: int, backend: Any) -> None:
        server_app._main(InProcessGrid(client_app, num_nodes), None)

    set_attr(runner, "make_client_app", lambda plan: plan)  # the grid needs the run's plan
    set_attr(runner, "_run_simulation", simulate)
    set_attr(runner, "start_ray", lambda *args, **kw: None)  # no Ray in this process
    set_attr(runner, "fork_workers", lambda *args, **kw: None)  # nor worker processes


@pytest.fixture()
def in_process(monkeypatch: pytest.MonkeyPatch, task_identity: None) -> None:
    _in_process(monkeypatch.setattr)


def _run(run_dir: Path, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    from fedpriv.run.runner import run_experiment

    return run_experiment(_cfg(overrides), run_dir)


def _resume(run_dir: Path, overrides: list[str] | None = None) -> dict[str, Any]:
    from fedpriv.run.runner import run_experiment

    return run_experiment(resume.resume_config(run_dir, overrides or []), run_dir)


def _outcome(run_dir: Path) -> tuple[dict[str, np.ndarray], dict[str, Any], list[list[str]]]:
    with np.load(run_dir / "model.npz") as data:
        model = {k: data[k] for k in data.files}
    res = json.loads((run_dir / "results.json").read_text())
    rows = [line.split(",") for line in (run_dir / "metrics.csv").read_text().splitlines()]
    time_col = rows[0].index("round_time_s")
    return model, res, [r[:time_col] + r[time_col + 1 :] for r in rows]  # times differ


def _assert_identical(run_dir: Path, ref_dir: Path) -> None:
    """Same model bit for bit, same ε (exactly), same metrics rows (but the round times)."""
    model, res, rows = _outcome(run_dir)
    ref_model, ref_res, ref_rows = _outcome(ref_dir)
    assert res["status"] == "complete", res["message"]
    assert model.keys() == ref_model.keys()
    for key in model:
        assert np.array_equal(model[key], ref_model[key]), key
    assert res["privacy"]["epsilon"] == ref_res["privacy"]["epsilon"]
    assert res["privacy"]["rounds_released"] == ref_res["privacy"]["rounds_released"] == ROUNDS
    assert rows == ref_rows
    assert [r["server_round"] for r in res["rounds"]] == list(range(1, ROUNDS + 1))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """The uninterrupted run (in-process) and its wall time in seconds."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    mp = pytest.MonkeyPatch()
    _in_process(mp.setattr)
    try:
        ref = tmp_path_factory.mktemp("reference")
        t0 = time.monotonic()
        summary = _run(ref)
        seconds = time.monotonic() - t0
    finally:
        mp.undo()
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved
    assert summary["status"] == "complete"
    return ref, seconds


class _Killed(BaseException):
    """Stands in for the process dying (not an Exception: nothing may catch it)."""


REAL_SAVE = checkpoint.save


def _dies_at(call: int) -> Any:
    """:func:`fedpriv.run.checkpoint.save` that dies on its ``call``-th call (1: checkpoint 0),
    before anything of that checkpoint is renamed into place."""
    calls = {"n": 0}

    def save(*args: Any, **kw: Any) -> Path:
        calls["n"] += 1
        if calls["n"] == call:
            raise _Killed
        return REAL_SAVE(*args, **kw)

    return save


def test_crash_at_every_checkpoint_write_resumes_identically(
    in_process: None,
    reference: tuple[Path, float],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Death while writing checkpoint k (before its rename), k = 3 and 7: resume is exact."""
    for k in (3, 7):
        run_dir = tmp_path / f"k{k}"
        monkeypatch.setattr(checkpoint, "save", _dies_at(k + 1))  # checkpoint 0 is call 1
        with pytest.raises(_Killed):
            _run(run_dir)
        monkeypatch.setattr(checkpoint, "save", REAL_SAVE)
        assert checkpoint.load(run_dir).round == k - 1
        rows = (run_dir / "metrics.csv").read_text().splitlines()
        assert len(rows) == 1 + k  # round k's row was written before its checkpoint
        assert json.loads((run_dir / "results.json").read_text())["status"] == "failed"
        summary = _resume(run_dir)
        assert summary["status"] == "complete"
        _assert_identical(run_dir, reference[0])


def test_stopped_run_extends_with_num_rounds(
    in_process: None, reference: tuple[Path, float], tmp_path: Path
) -> None:
    """A complete 4-round run, resumed with num_rounds=10, equals the 10-round run; resuming
    it again without more rounds is refused."""
    run_dir = tmp_path / "short"
    _run(run_dir, ["num_rounds=4"])
    with pytest.raises(ConfigError, match=r"is complete \(4 rounds\).*num_rounds=M with M > 4"):
        resume.resume_config(run_dir, [])
    summary = _resume(run_dir, [f"num_rounds={ROUNDS}"])
    assert summary["status"] == "complete"
    _assert_identical(run_dir, reference[0])
    res = json.loads((run_dir / "results.json").read_text())
    assert res["resumed"] == [4] and res["config"]["num_rounds"] == ROUNDS


def test_resume_refusals_are_one_line(
    in_process: None, reference: tuple[Path, float], tmp_path: Path
) -> None:
    ref = reference[0]
    cases = [
        (tmp_path / "nope", [], "is not a directory"),
        (tmp_path, [], "has no config_resolved.yaml"),
        (ref, ["num_rounds=12", "privacy.noise_multiplier=2.0"], "cannot change"),
        (ref, [], "is complete"),
    ]
    for run_dir, overrides, text in cases:
        with pytest.raises(ConfigError) as err:
            resume.resume_config(run_dir, overrides)
        assert text in str(err.value) and "\n" not in str(err.value)
        assert str(err.value).startswith(f"resume={str(run_dir)!r}")
    no_ckpt = tmp_path / "no_ckpt"
    no_ckpt.mkdir()
    (no_ckpt / "config_resolved.yaml").write_text((ref / "config_resolved.yaml").read_text())
    with pytest.raises(ConfigError, match="has no checkpoint.npz"):
        resume.resume_config(no_ckpt, [])
    # a directory another process runs in is refused (the lock dies with its holder)
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(ref)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(
            ConfigError, match=rf"is in use: another fedpriv process \(pid {holder.pid}\)"
        ):
            checkpoint.lock_run(ref)
    finally:
        holder.kill()
        holder.wait()
    checkpoint.lock_run(ref).close()
    # an override equal to the saved value changes nothing: allowed
    assert resume.resume_config(ref, ["num_rounds=12", "seed=0"]).num_rounds == 12
    # a stopped run cannot be "continued" to fewer rounds than it has run
    stopped = tmp_path / "stopped"
    shutil.copytree(ref, stopped)
    doc = json.loads((stopped / "results.json").read_text())
    (stopped / "results.json").write_text(json.dumps({**doc, "status": "stopped"}))
    with pytest.raises(ConfigError, match=r"num_rounds=3 must be >= the 10 rounds"):
        resume.resume_config(stopped, ["num_rounds=3"])


LOCK_HOLDER = """
import sys, time
from pathlib import Path
from fedpriv.run.checkpoint import lock_run
lock = lock_run(Path(sys.argv[1]))
print("locked", flush=True)
time.sleep(60)
"""


class NotResumable(DPFedAvg):
    """A strategy that keeps no checkpoint (as ``strategy=checkin`` today)."""

    resumable: ClassVar[bool] = False


def test_strategy_without_checkpoints_is_refused_naming_it(
    in_process: None, tmp_path: Path
) -> None:
    run_dir = tmp_path / "nr"
    _run(run_dir, ["num_rounds=2", "strategy._target_=tests.test_resume.NotResumable"])
    assert not (run_dir / checkpoint.CHECKPOINT_NAME).exists()
    (run_dir / "results.json").write_text('{"status": "failed"}')
    (run_dir / checkpoint.CHECKPOINT_NAME).write_bytes(b"")  # even with a (foreign) file
    from fedpriv.run.runner import run_experiment

    cfg = _cfg(["num_rounds=2", "strategy._target_=tests.test_resume.NotResumable"])
    cfg.resume = str(run_dir)
    with pytest.raises(ConfigError, match="strategy NotResumable writes no checkpoint"):
        run_experiment(cfg, run_dir)
    with pytest.raises(ConfigError) as err:  # what `fedpriv resume=RUN_DIR` says
        resume.resume_config(run_dir, [])
    assert str(err.value) == (
        f"resume={str(run_dir)!r} cannot be continued: strategy "
        "tests.test_resume.NotResumable writes no checkpoint "
        "(resume supports strategy=fedavg, strategy=async_fedavg)"
    )
    assert resume.strategy_resumable("strategies.fedavg.DPFedAvg")
    assert resume.strategy_resumable("strategies.async_fedavg.AsyncDPFedAvg")
    assert not resume.strategy_resumable("strategies.checkin_server.CheckinStrategy")


def test_async_fedavg_resumes_identically(
    in_process: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Async FedAvg keeps its recent models in the checkpoint: resume is exact."""
    extra = [*RECORD_LEVEL, "num_rounds=6"]
    ref, run_dir = tmp_path / "ref", tmp_path / "run"
    _run(ref, extra)
    monkeypatch.setattr(checkpoint, "save", _dies_at(5))  # the checkpoint of round 4
    with pytest.raises(_Killed):
        _run(run_dir, extra)
    monkeypatch.setattr(checkpoint, "save", REAL_SAVE)
    assert checkpoint.load(run_dir).round == 3
    assert any(k.startswith("history/2/") for k in checkpoint.load(run_dir).strategy)
    _resume(run_dir)
    model, res, rows = _outcome(run_dir)
    ref_model, ref_res, ref_rows = _outcome(ref)
    assert all(np.array_equal(model[k], ref_model[k]) for k in ref_model)
    assert res["privacy"]["epsilon"] == ref_res["privacy"]["epsilon"] and rows == ref_rows


def test_secure_mode_counts_a_round_lost_after_its_release(
    in_process: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """secure_mode: the process dies after round 3 was released, before its checkpoint; the
    resumed run dies the same way in round 5. Each redo draws new noise (a second release),
    so the ledger counts 12 releases for 10 rounds; a lost round is counted once."""
    extra = ["privacy.secure_mode=true"]
    run_dir = tmp_path / "secure"
    monkeypatch.setattr(checkpoint, "save", _dies_at(4))  # the checkpoint of round 3
    with pytest.raises(_Killed):
        _run(run_dir, extra)
    monkeypatch.setattr(checkpoint, "save", REAL_SAVE)
    marker = checkpoint.read_started(run_dir)
    assert marker is not None and marker["round"] == 3 and marker["contributors"] == 4
    # killed again in round 5 (after the lost round 3 was accounted on resume)
    # calls: the lost round's checkpoint, rounds 3 and 4, then round 5's
    monkeypatch.setattr(checkpoint, "save", _dies_at(4))
    with pytest.raises(_Killed):
        _resume(run_dir)
    monkeypatch.setattr(checkpoint, "save", REAL_SAVE)
    assert checkpoint.load(run_dir).round == 4
    summary = _resume(run_dir)
    assert summary["status"] == "complete"
    res = json.loads((run_dir / "results.json").read_text())
    statuses = [(r["server_round"], r["status"]) for r in res["rounds"]]
    assert statuses == [(1, "ok"), (2, "ok"), (3, "lost"), *[(r, "ok") for r in range(3, 5)]] + [
        (5, "lost"),
        *[(r, "ok") for r in range(5, 11)],
    ]
    from fedpriv.run.prepare import prepare

    plan, _ = prepare(_cfg(extra))
    expected = RunPrivacy(plan.privacy, plan.cohort.nominal_size)
    for _ in range(ROUNDS + 2):  # 10 released rounds and 2 lost attempts
        expected.record_round()
    assert res["privacy"]["rounds_released"] == ROUNDS + 2
    from fedpriv.report.display import format_row

    assert format_row(res["rounds"][2]).startswith("    3  round lost: round 3 was started")
    assert res["privacy"]["epsilon"] == pytest.approx(expected.epsilon(), rel=1e-12)


def test_random_allocation_epoch_is_counted_once_across_a_resume(
    in_process: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random allocation accounts each epoch once (its first round); a death in the middle of
    an epoch must not count the epoch again after the resume (the checkpoint keeps the
    recorded epochs): ε equals the uninterrupted run's."""
    extra = [
        "num_rounds=4",
        "client_sampling=random_allocation",
        "allocation_window=2",
        "rounds_per_client=1",
        "privacy.accountant=pld",
    ]
    ref, run_dir = tmp_path / "ref", tmp_path / "run"
    _run(ref, extra)
    monkeypatch.setattr(checkpoint, "save", _dies_at(3))  # round 2's: mid epoch 0
    with pytest.raises(_Killed):
        _run(run_dir, extra)
    monkeypatch.setattr(checkpoint, "save", REAL_SAVE)
    ckpt = checkpoint.load(run_dir)
    assert ckpt.round == 1 and ckpt.meta["privacy"]["epochs"] == [0]
    _resume(run_dir)
    model, res, rows = _outcome(run_dir)
    ref_model, ref_res, ref_rows = _outcome(ref)
    assert ref_res["privacy"]["ledger"] == res["privacy"]["ledger"]
    assert res["privacy"]["epsilon"] == ref_res["privacy"]["epsilon"] and rows == ref_rows
    assert all(np.array_equal(model[k], ref_model[k]) for k in ref_model)


# ---- kill -9 at random moments ------------------------------------------------------------
KILLS = 20


def _rows(run_dir: Path) -> int:
    """Rounds written to metrics.csv so far (0 before the header)."""
    try:
        return max(len((run_dir / "metrics.csv").read_text().splitlines()) - 1, 0)
    except OSError:
        return 0


def _child(run_dir: str) -> None:
    """A run in a process of its own (forkserver child), killed by the test."""
    _in_process(setattr)
    _run(Path(run_dir))
    os._exit(0)


@pytest.mark.slow
def test_kill_9_at_20_random_moments_resumes_identically(
    in_process: None, reference: tuple[Path, float], tmp_path: Path
) -> None:
    """Each run is killed with SIGKILL at a moment drawn uniformly over the run's duration
    (after its first checkpoint), resumed, and compared with the uninterrupted run."""
    ref = reference[0]
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(
        [
            "fedpriv.run.runner",
            "fedpriv.run.checkpoint",
            "clients.client_level_dpfedavg",
            "strategies.fedavg",
            "tests.test_resume",
            "torch._dynamo",  # imported by the first training step: once, not per child
        ]
    )

    def start(run_dir: Path) -> tuple[Any, float]:
        proc = ctx.Process(target=_child, args=(str(run_dir),))
        proc.start()
        deadline = time.monotonic() + 120
        while not (run_dir / checkpoint.CHECKPOINT_NAME).exists():
            assert proc.is_alive() and time.monotonic() < deadline, "child did not start"
            time.sleep(0.005)
        return proc, time.monotonic()

    proc, started = start(tmp_path / "whole")  # how long a child runs after checkpoint 0
    proc.join()
    seconds = time.monotonic() - started
    assert proc.exitcode == 0 and checkpoint.run_status(tmp_path / "whole") == "complete"
    rng = np.random.default_rng(14)
    killed_after: list[int] = []
    for i in range(KILLS):
        run_dir = tmp_path / f"kill{i}"
        # a moment drawn uniformly over the run: a round drawn uniformly, then a uniform
        # delay within one round's time after that round's row is written (machine load
        # changes how long a run takes, not where in it the kill lands)
        target = int(rng.integers(0, 10))
        for _attempt in range(4):
            proc, started = start(run_dir)
            while proc.exitcode is None and _rows(run_dir) < target:
                time.sleep(0.001)
            time.sleep(rng.uniform(0, seconds / 10))
            finished = proc.exitcode is not None
            if not finished:
                proc.kill()  # SIGKILL
            proc.join()
            if not finished and checkpoint.run_status(run_dir) != "complete":
                break
            target = max(target - 1, 0)  # it ended first: kill sooner
            for f in run_dir.iterdir():
                f.unlink()
        else:
            pytest.fail(f"run {i} ended before every kill")
        killed_after.append(checkpoint.load(run_dir).round)
        summary = _resume(run_dir)
        assert summary["status"] == "complete"
        _assert_identical(run_dir, ref)
    print(f"killed after checkpoints of rounds {sorted(killed_after)}")
    assert len(killed_after) == KILLS
    assert len(set(killed_after)) >= 4  # the moments spread over the run


@pytest.mark.slow
def test_cli_kill_9_then_resume_on_ray(in_process: None, tmp_path: Path) -> None:
    """The real command on Flower's Ray engine: ``kill -9`` of the process group after round
    2's checkpoint, then ``fedpriv resume=RUN_DIR``: same model and ε as a run never killed
    (the in-process run: the engine changes nothing); ``fedpriv resume=`` of a missing
    directory is one line, exit 2."""
    exe = str(Path(sys.executable).with_name("fedpriv"))
    args = [*BASE, "num_rounds=4", "ray_init_args.num_cpus=2", "client_resources.num_cpus=1"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ref, run_dir = tmp_path / "ref", tmp_path / "run"
    assert _run(ref, ["num_rounds=4"])["status"] == "complete"
    proc = subprocess.Popen(
        [exe, *args, f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                if checkpoint.load(run_dir).round >= 2:
                    break
            except ConfigError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert checkpoint.run_status(run_dir) == "running"
    hydra_files = {p.name: p.read_text() for p in (run_dir / ".hydra").iterdir()}

    def fedpriv(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [exe, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )

    resumed = fedpriv(f"resume={run_dir}")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    # outputs stay in RUN_DIR: no new Hydra directory, the run's own .hydra/ unchanged
    assert not (tmp_path / "outputs").exists()
    assert {p.name: p.read_text() for p in (run_dir / ".hydra").iterdir()} == hydra_files
    assert "resuming after round" in resumed.stdout + resumed.stderr
    model, res, rows = _outcome(run_dir)
    ref_model, ref_res, ref_rows = _outcome(ref)
    assert res["status"] == "complete" and rows == ref_rows
    assert all(np.array_equal(model[k], ref_model[k]) for k in ref_model)
    assert res["privacy"]["epsilon"] == ref_res["privacy"]["epsilon"]
    missing = fedpriv(f"resume={tmp_path / 'missing'}")
    assert missing.returncode == 2
    assert missing.stderr.strip().count("\n") == 0 and "is not a directory" in missing.stderr
