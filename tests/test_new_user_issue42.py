"""What a new user hit this week (issue 42, item 5), each fixed and kept as a test: bad input
ends in one line (exit 2) before anything is written, and Ctrl-C stops a whole table.

a) ``privacy.sample_rate=0`` is refused when the run is built (every client used to fail in
   round 1); ``fedpriv-account`` still answers ε = 0 for it.
b) a ``hydra.run.dir`` / ``hydra.sweep.dir`` that cannot be created is one line, no traceback.
c) the structured-config schema nodes (``client=dpsgd_schema``) are no options.
d) a ``_target_`` that cannot be imported prints fedpriv's line only (no Hydra ERROR log line).
e) the README's "one run, whole cluster" command composes and validates as written.
f) ``scripts/client_level_table.py``: a SIGINT stops the whole table, keeps what was written and
   marks the table unfinished.
"""

from __future__ import annotations

import contextlib
import csv
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fedpriv.cli.experiment import check_run_dirs
from fedpriv.common.errors import ConfigError
from fedpriv.run.config import check_known_keys, compose_config, group_options
from fedpriv.run.migration import check_argv
from fedpriv.run.prepare import build_server, central_analysis, prepare
from tests.cli import run_fedpriv
from tests.test_readme_commands import commands, fedpriv_overrides, words_of

REPO = Path(__file__).resolve().parents[1]


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one ``fedpriv: error:`` line of a refused command (exit 2, nothing else printed)."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(lines) == 1 and lines[0].startswith("fedpriv: error: "), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    return lines[0]


# --------------------------------------------------------------------------- a) sample_rate=0


@pytest.mark.parametrize("client", ["dpsgd", "skellam_dpsgd"])
def test_a_zero_sample_rate_is_refused_when_the_run_is_built(client: str) -> None:
    cfg = compose_config([f"client={client}", "privacy.sample_rate=0"])
    with pytest.raises(ConfigError) as info:
        prepare(cfg)  # used to pass: each client then refused q = 0 in round 1
    assert str(info.value) == (
        "privacy.sample_rate=0.0 must be in (0, 1] for a run (at 0 no step would use any record)"
    )


def test_a_zero_sample_rate_is_one_line_from_the_cli(tmp_path: Path) -> None:
    out = tmp_path / "run"
    line = one_error_line(run_fedpriv(["privacy.sample_rate=0", f"hydra.run.dir={out}"]))
    assert line.startswith("fedpriv: error: privacy.sample_rate=0.0 must be in (0, 1] for a run")
    assert not (out / "results.json").exists()


def test_the_accounting_cli_still_answers_for_a_zero_sample_rate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from fedpriv.cli.account import main

    args = ["poisson-gaussian", "noise_multiplier=1", "sample_rate=0", "steps=10"]
    assert main([*args, "target_delta=1e-5"]) == 0, capsys.readouterr().err


# --------------------------------------------------------------------------- b) run directories


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize(
    ("args", "key", "example"),
    [
        (["hydra.run.dir=/proc/nope"], "hydra.run.dir", "outputs/my-run"),
        (["-m", "hydra.sweep.dir=/proc/nope", "seed=0,1"], "hydra.sweep.dir", "multirun/my-sweep"),
        (["hydra.run.dir=/proc/nope/a/b"], "hydra.run.dir", "outputs/my-run"),
    ],
)
def test_a_run_directory_that_cannot_be_created_is_one_line(
    args: list[str], key: str, example: str
) -> None:
    line = one_error_line(run_fedpriv(args))
    assert line.startswith(f"fedpriv: error: {key}='/proc/nope")
    assert "cannot be created (No such file or directory: /proc/nope)" in line
    assert line.endswith(f"give a directory you can write, e.g. {key}={example}")


def test_the_run_directory_check_leaves_nothing_behind(tmp_path: Path) -> None:
    check_run_dirs([f"hydra.run.dir={tmp_path / 'a' / 'b' / 'c'}"])
    check_run_dirs([f"hydra.sweep.dir={tmp_path / 'm'}/${{now:%H-%M-%S}}"])  # interpolated
    assert sorted(tmp_path.iterdir()) == []
    (tmp_path / "kept").mkdir()
    check_run_dirs([f"hydra.run.dir={tmp_path / 'kept'}"])  # an existing one stays, empty
    assert [p.name for p in tmp_path.iterdir()] == ["kept"]
    assert list((tmp_path / "kept").iterdir()) == []


# --------------------------------------------------------------------------- c) schema nodes


@pytest.mark.parametrize(
    "args",
    [
        ["client=dpsgd_schema"],
        ["strategy=fedavg_schema"],
        ["privacy=dpsgd_schema"],
        ["-m", "client=dpsgd,dpsgd_schema"],
    ],
)
def test_a_schema_node_is_not_an_option(args: list[str], tmp_path: Path) -> None:
    proc = run_fedpriv([*args, f"hydra.run.dir={tmp_path / 'run'}"])
    line = one_error_line(proc)
    group = args[-1].split("=")[0]
    real = ", ".join(group_options(group))
    assert line.endswith(f"is an internal schema, not an option: choose one of {real}")
    assert "_schema" not in real
    assert not (tmp_path / "run").exists()


def test_a_schema_node_matched_by_a_sweep_glob_is_refused_by_its_job(tmp_path: Path) -> None:
    proc = run_fedpriv(["-m", "client=glob(dpsgd_s*)", f"hydra.sweep.dir={tmp_path}"])
    assert proc.returncode == 2, proc.stderr
    assert "fedpriv: error: client='dpsgd_schema' is an internal schema" in proc.stderr
    assert not list(tmp_path.rglob("results.json"))


def test_an_unknown_option_lists_only_the_real_options() -> None:
    line = one_error_line(run_fedpriv(["client=nope"]))
    assert line.endswith("available: " + ", ".join(group_options("client")))
    assert "_schema" not in line


# --------------------------------------------------------------------------- d) _target_


@pytest.mark.parametrize(
    ("override", "start"),
    [
        ("client._target_=nope.Nope", "client._target_='nope.Nope' could not be built"),
        ("strategy._target_=nope.Nope", "strategy._target_='nope.Nope' could not be built"),
        ("aggregator._target_=os.path", "aggregator._target_='os.path' must name"),
    ],
)
def test_a_target_that_cannot_be_built_prints_only_fedprivs_line(
    override: str, start: str, tmp_path: Path
) -> None:
    proc = run_fedpriv([override, f"hydra.run.dir={tmp_path / 'run'}"])
    line = one_error_line(proc)
    assert line.startswith(f"fedpriv: error: {start}")
    assert "Error getting" not in proc.stdout + proc.stderr  # hydra.utils' ERROR log line
    assert proc.stdout.strip() == ""


# --------------------------------------------------------------------------- e) README command


def _cluster_commands(path: Path) -> list[list[str]]:
    """The one-run cluster commands of ``path`` (``ray_init_args.address=HEAD_IP`` without
    ``-m``), as words."""
    found = []
    for command in commands(path.read_text()):
        words = words_of(command)
        if words[0] == ".venv/bin/fedpriv" and "HEAD_IP" in command and "-m" not in words:
            found.append(words[1:])
    return found


@pytest.mark.parametrize("doc", ["README.md", "docs/scale.md"])
def test_the_whole_cluster_command_composes_and_validates(doc: str) -> None:
    """The command as written (the embedded set holds 6,000 training records, one per client
    at most): checks of the command line, composition, then the run's plan, algorithm,
    server and analysis (all but Ray and the rounds)."""
    (args,) = _cluster_commands(REPO / doc)
    assert "client_sampling=fixed_size" in args
    check_argv(args)
    check_run_dirs(args)
    cfg = compose_config(fedpriv_overrides(args))
    check_known_keys(cfg)
    plan, algorithm = prepare(cfg)  # refused num_clients=100000 on the 6,000 records
    build_server(plan, algorithm)
    assert central_analysis(plan)
    assert plan.num_clients <= 6000 and plan.cohort.nominal_size < plan.num_clients


# --------------------------------------------------------------------------- f) Ctrl-C in a table

FAKE_FEDPRIV = textwrap.dedent(
    """
    # Stands in for fedpriv: the eps1 run completes at once; any other run writes its pid and
    # waits, and a SIGINT stops it as fedpriv does (results.json "stopped", exit 130).
    import json, os, signal, sys, time
    from pathlib import Path

    run_dir = Path(next(a.split("=", 1)[1] for a in sys.argv if a.startswith("hydra.run.dir=")))
    run_dir.mkdir(parents=True)
    def save(status):
        (run_dir / "results.json").write_text(json.dumps({
            "status": status, "rounds": [{"accuracy": 0.5}],
            "privacy": {"epsilon": 1.0, "noise_multiplier": 2.0},
        }))
    if "-eps1-" in run_dir.name:
        save("complete")
        sys.exit(0)
    def stop(signum, frame):
        save("stopped")
        sys.exit(128 + signum)
    signal.signal(signal.SIGINT, stop)
    (run_dir / "pid").write_text(str(os.getpid()))
    time.sleep(60)
    save("complete")
    """
)

DRIVER = textwrap.dedent(
    """
    # The table script as it is, its fedpriv command pointed at the stand-in.
    import importlib.util, subprocess, sys
    spec = importlib.util.spec_from_file_location("client_level_table", sys.argv[1])
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)

    class Subprocess:
        def __getattr__(self, name):
            return getattr(subprocess, name)
        def _fake(self, cmd):
            fedpriv = [sys.executable, "-m", "fedpriv.cli.experiment"]
            return [sys.executable, sys.argv[2], *cmd[3:]] if cmd[:3] == fedpriv else cmd
        def run(self, cmd, *args, **kw):
            return subprocess.run(self._fake(cmd), *args, **kw)
        def Popen(self, cmd, *args, **kw):
            return subprocess.Popen(self._fake(cmd), *args, **kw)

    table.subprocess = Subprocess()
    table.main(["--out", sys.argv[3], "--samplers", "poisson", "--targets", "1", "3", "8"])
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("to", ["the run", "the table's process group"])
def test_sigint_stops_the_whole_table_and_marks_it_unfinished(tmp_path: Path, to: str) -> None:
    """SIGINT to the run alone (``kill -INT``: the table used to go on to its next run) or
    to the table's process group (a terminal's Ctrl-C): the table stops, runs.csv keeps the
    finished run and the interrupted one, table.md says unfinished, exit 130, no next run."""
    fake, driver, out = tmp_path / "fake_fedpriv.py", tmp_path / "driver.py", tmp_path / "out"
    fake.write_text(FAKE_FEDPRIV)
    driver.write_text(DRIVER)
    script = REPO / "scripts" / "client_level_table.py"
    proc = subprocess.Popen(
        [sys.executable, str(driver), str(script), str(fake), str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a shell job has
    )
    pid_file = out / "poisson-eps3-seed0" / "pid"
    child = 0
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text()):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the second run did not start (table exit {proc.poll()})")
            time.sleep(0.05)
        child = int(pid_file.read_text())
        if to == "the run":
            os.kill(child, signal.SIGINT)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:  # whatever happened: the run by its pid, the table and what it started by theirs
        if child and _alive(child):
            os.kill(child, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):  # a live group id is never a new pid
            os.killpg(proc.pid, signal.SIGKILL)  # the table's group: its id is the table's pid
        proc.wait(timeout=10)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert not (out / "poisson-eps8-seed0").exists(), "the table went on to its next run"
    with open(out / "runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["target_epsilon"], r["status"]) for r in rows] == [
        ("1.0", "complete"),
        ("3.0", "interrupted"),
    ]
    table = (out / "table.md").read_text()
    assert table.startswith("**Unfinished**: stopped by SIGINT during poisson at ε ≈ 3, seed 0")
    assert "0.5000 σ=2.000, ε=1.000" in table  # the finished run is kept
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines == [
        f"client_level_table: stopped by SIGINT during poisson at ε ≈ 3, seed 0; "
        f"{out / 'runs.csv'} keeps 1 complete run(s), {out / 'table.md'} is marked unfinished"
    ]
    # the run got exactly one SIGINT: it stopped after its round ("stopped", not aborted)
    assert '"stopped"' in (out / "poisson-eps3-seed0" / "results.json").read_text()
