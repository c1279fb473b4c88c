"""Issue 14, items 2, 3 and 5: client faults, an unreachable Ray address, signals, SIGKILL.

End-to-end runs are tiny (4 clients, logistic model): what is measured is the run's reaction,
read back from its files (results.json, metrics.csv, errors.log) and the process's exit code.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from hydra import compose, initialize_config_dir

from fedpriv.common.errors import ConfigError
from fedpriv.run.config import conf_dir, register_schema
from fedpriv.run.prepare import prepare
from fedpriv.run.round_log import RunFailed
from fedpriv.run.run_privacy import RunPrivacy
from fedpriv.run.runner import run_experiment
from tests.cli import run_fedpriv

REPO = Path(__file__).resolve().parents[1]
TINY = ["num_clients=4", "model=logistic", "progress=false", "client.steps=2", "plot=false"]
FAULTY = ["client._target_=examples.faulty_client.FaultyDPSGD", "+client.fail_round=2"]


def _cfg(overrides: list[str]) -> Any:
    register_schema()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _results(out: Path) -> dict[str, Any]:
    return json.loads((out / "results.json").read_text())


def _expected_epsilon(overrides: list[str], contributors: list[int | None]) -> float:
    """ε of the same algorithm with the rounds recorded independently of the run."""
    plan, _ = prepare(_cfg(overrides))
    privacy = RunPrivacy(plan.privacy, plan.cohort.nominal_size)
    for r, c in enumerate(contributors, start=1):
        privacy.record_round(c, r)
    return privacy.epsilon()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "reason"), [("raise", "client error"), ("non_finite", "non-finite")]
)
def test_failing_client_is_a_dropout_under_drop(tmp_path: Path, mode: str, reason: str) -> None:
    """round_failure=drop: client 0 fails in round 2; the round is released from the 3
    survivors and accounted with their noise (degraded events), the row says so, the error
    is one line on the console and its traceback is in errors.log."""
    overrides = [*TINY, "num_rounds=3", *FAULTY, f"+client.fail_mode={mode}"]
    summary = run_experiment(_cfg(overrides), tmp_path)
    rows = summary["rounds"]
    assert summary["status"] == "complete" and summary["exit_code"] == 0
    assert [r["status"] for r in rows] == ["ok", "ok", "ok"]
    assert [r["clients_dropped"] for r in rows] == [0, 1, 0]
    assert reason in rows[1]["dropped"]
    want = _expected_epsilon(overrides, [None, 3, None])
    assert rows[-1]["epsilon"] == pytest.approx(want, rel=1e-9)
    assert rows[-1]["epsilon"] > _expected_epsilon(overrides, [None, None, None])
    if mode == "raise":
        log = (tmp_path / "errors.log").read_text()
        assert "round 2: client 0: ValueError: injected failure of client 0" in log
        assert "Traceback (most recent call last)" in log


@pytest.mark.slow
def test_failing_client_ends_the_run_under_stop(tmp_path: Path) -> None:
    """round_failure=stop: the run ends in round 2 with the client's error in one line,
    status failed, and the ledger holds round 1 only (nothing of round 2 was released)."""
    overrides = [*TINY, "num_rounds=3", *FAULTY, "round_failure=stop"]
    with pytest.raises(RunFailed) as info:
        run_experiment(_cfg(overrides), tmp_path)
    line = str(info.value)
    assert "\n" not in line
    assert line.startswith("round 2: client 0: ValueError: injected failure of client 0;")
    doc = _results(tmp_path)
    assert doc["status"] == "failed" and doc["privacy"]["rounds_released"] == 1
    assert doc["privacy"]["epsilon"] == pytest.approx(_expected_epsilon(overrides, [None]))


@pytest.mark.slow
def test_timed_out_client_is_a_dropout_and_the_run_ends(tmp_path: Path) -> None:
    """A client that never answers (sleeps for an hour) in round 2: the round times out,
    its worker's clients count as dropped (no reply), round 3 runs, and the run ends complete
    instead of waiting for the sleeping actor."""
    overrides = [*TINY, "num_rounds=3", *FAULTY, "+client.fail_mode=sleep", "round_timeout=10"]
    t0 = time.monotonic()
    summary = run_experiment(_cfg(overrides), tmp_path)
    assert time.monotonic() - t0 < 600  # not 3600 s
    rows = summary["rounds"]
    assert summary["status"] == "complete" and [r["status"] for r in rows] == ["ok"] * 3
    assert rows[1]["clients_dropped"] >= 1 and "no reply" in rows[1]["dropped"]


def test_unknown_round_failure_is_refused() -> None:
    with pytest.raises(ConfigError, match="round_failure='retry' must be one of"):
        prepare(_cfg([*TINY, "round_failure=retry"]))
    with pytest.raises(ConfigError, match="ray_connect_timeout_s=0.0 must be > 0"):
        prepare(_cfg([*TINY, "ray_connect_timeout_s=0"]))


def _cli(args: list[str], out: Path, **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "fedpriv.cli.experiment", *args, f"hydra.run.dir={out}"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def test_unreachable_ray_address_is_one_line_within_the_timeout(tmp_path: Path) -> None:
    """Port 1 of the loopback address: nothing listens there."""
    out = tmp_path / "run"
    t0 = time.monotonic()
    proc = run_fedpriv(
        ["ray_init_args.address=127.0.0.1:1", "num_rounds=1", f"hydra.run.dir={out}"]
    )
    err = proc.stderr
    assert proc.returncode == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "ray_init_args.address='127.0.0.1:1' must name a running" in err
    assert time.monotonic() - t0 < 60  # interpreter and imports included; the probe is < 10 s
    assert not (out / "results.json").exists()


def test_existing_run_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text("{}")
    proc = run_fedpriv(["num_rounds=1", f"hydra.run.dir={tmp_path}"])
    assert proc.returncode == 2 and "already holds a run (results.json)" in proc.stderr


@pytest.mark.slow
def test_default_run_directories_differ_between_processes() -> None:
    """Two runs started in the same second: the run directory ends with the process id."""
    code = (
        "from hydra import compose, initialize_config_dir;"
        "from omegaconf import OmegaConf;"
        "from fedpriv.run.config import conf_dir, register_schema;register_schema();"
        "from hydra.core.utils import setup_globals;setup_globals();"
        "ctx=initialize_config_dir(config_dir=str(conf_dir()), version_base='1.3');ctx.__enter__();"
        "c=compose(config_name='config', return_hydra_config=True);print(c.hydra.run.dir)"
    )
    dirs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
        for _ in range(2)
    ]
    names = [d.stdout.strip() for d in dirs]
    assert all(n.startswith("outputs/") for n in names), [d.stderr[-300:] for d in dirs]
    assert names[0] != names[1]


def _long_run(out: Path, engine: str) -> tuple[subprocess.Popen[str], list[psutil.Process]]:
    """A run of many fast rounds on ``engine``, started in its own session; returns once 2
    rounds are written, with the processes of its tree (Ray's or the forked workers)."""
    proc = _cli([*TINY, "num_rounds=5000", f"engine={engine}"], out, start_new_session=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        csv = out / "metrics.csv"
        if csv.exists() and len(csv.read_text().splitlines()) >= 3:
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    tree = psutil.Process(proc.pid).children(recursive=True)
    if engine == "ray":
        assert any("raylet" in _cmdline(p) for p in tree)
    else:  # the two forked workers
        assert len(tree) == 2 and all(p.ppid() == proc.pid for p in tree)
    return proc, tree


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def _all_gone(tree: list[psutil.Process], within: float = 20.0) -> list[str]:
    _, alive = psutil.wait_procs(tree, timeout=within)
    return [f"{p.pid} {p.name()}" for p in alive if p.is_running()]


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["processes", "ray"])
def test_sigterm_finishes_the_round_and_saves_stopped(tmp_path: Path, engine: str) -> None:
    proc, tree = _long_run(tmp_path, engine)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    doc = _results(tmp_path)
    assert doc["status"] == "stopped" and "SIGTERM" in doc["message"]
    assert (tmp_path / "model.npz").exists()
    assert doc["privacy"]["rounds_released"] == len(doc["rounds"])
    assert _all_gone(tree) == []


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["processes", "ray"])
def test_second_sigint_to_the_process_group_aborts_at_once(tmp_path: Path, engine: str) -> None:
    """Ctrl-C twice in a terminal: SIGINT to the whole process group (Ray's processes too)."""
    proc, tree = _long_run(tmp_path, engine)
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 30
    assert proc.returncode == 1, err[-2000:]
    assert "aborted by a second signal (SIGINT)" in err
    assert "Traceback" not in err
    assert _results(tmp_path)["status"] == "failed"
    assert _all_gone(tree) == []


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["processes", "ray"])
def test_sigkill_leaves_no_process(tmp_path: Path, engine: str) -> None:
    """kill -9: nothing of the run can clean up; the reaper kills the run's Ray tree, and
    the forked workers die with the run (PR_SET_PDEATHSIG)."""
    proc, tree = _long_run(tmp_path, engine)
    proc.kill()
    proc.communicate(timeout=60)
    assert _all_gone(tree) == []  # the reaper itself ends once it has reaped
    assert _results(tmp_path)["status"] == "running"  # killed: never looks finished


def test_help_describes_the_fields_of_the_named_groups() -> None:
    proc = run_fedpriv(["client=client_level", "--help"])
    assert proc.returncode == 0, proc.stderr
    assert "client: batch_clipping, checkin," in proc.stdout
    # every field with its default and the description its class documents
    assert "round_failure: drop  # A client that raises, times out or sends NaN" in proc.stdout
    assert "  noise_placement: server  # The trusted aggregator adds the noise" in proc.stdout


@pytest.mark.parametrize(
    ("wanted", "message"),
    [
        (
            {"num_cpus": 1, "num_gpus": 1},
            "client_resources.num_gpus=1 must be at most the Ray "
            "instance's 0 GPUs (no client actor could start): set client_resources.num_gpus=0",
        ),
        (
            {"num_cpus": 100, "num_gpus": 0},
            "client_resources.num_cpus=100 must be at most the Ray instance's 16 CPUs",
        ),
    ],
)
def test_client_resources_beyond_the_ray_instance_are_named(
    wanted: dict[str, float], message: str
) -> None:
    from fedpriv.run.ray_session import check_fits

    with pytest.raises(ConfigError) as info:
        check_fits({"CPU": 16.0, "memory": 1e9}, wanted)
    assert str(info.value).startswith(message)
    check_fits({"CPU": 16.0, "GPU": 1.0}, {"num_cpus": 16, "num_gpus": 1})  # fits exactly


def test_ray_address_forms() -> None:
    from fedpriv.run.ray_session import probe_address

    with pytest.raises(ConfigError, match="must be local, auto, HOST:PORT or ray://HOST:PORT"):
        probe_address("127.0.0.1", 1.0)
    with pytest.raises(ConfigError, match=r"ray://127.0.0.1:1' must name a running Ray cluster"):
        probe_address("ray://127.0.0.1:1", 1.0)


def test_empty_resume_is_refused(tmp_path: Path) -> None:
    proc = run_fedpriv(["resume=", f"hydra.run.dir={tmp_path / 'run'}"])
    assert proc.returncode == 2 and "resume='' must name a run directory" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "delay"), [(signal.SIGTERM, 0.0), (signal.SIGTERM, 1.0), (signal.SIGINT, 0.5)]
)
def test_signal_during_start_up_is_one_line_and_not_resumable(
    tmp_path: Path, sig: signal.Signals, delay: float
) -> None:
    """Issue 27, item 4: a line says Ray is starting; a signal then (at once, or ``delay`` s
    later, inside ``ray.init`` with its own SIGTERM handler) exits 128 + its number with one
    line, and ``resume=`` on the directory says the run stopped before its first
    checkpoint."""
    proc = _cli([*TINY, "num_rounds=1", "engine=ray"], tmp_path, start_new_session=True)
    assert proc.stderr is not None
    line = proc.stderr.readline()  # blocks until the first line: the start of Ray
    assert line.startswith("fedpriv: starting Ray (a local instance)"), line
    time.sleep(delay)
    tree = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err[-2000:]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(
        f"fedpriv: stopped by {sig.name} during start-up, before the first round"
    ), err[-2000:]
    assert not (tmp_path / "results.json").exists()
    assert _all_gone(tree) == []
    again = run_fedpriv([f"resume={tmp_path}"])
    assert again.returncode == 2
    assert "stopped during start-up, before its first checkpoint" in again.stderr
