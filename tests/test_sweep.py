"""Sweeps on a real two-node local Ray cluster (``hydra/launcher=ray``) and ``fedpriv-report``.

The cluster is started by the test with the venv's ``ray`` binary on free ports and in its own
temp dir (so it never becomes the machine's default cluster that a plain ``ray.init()`` of
another session would join), and stopped by the PIDs it started — never ``ray stop``.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant

from fedpriv.run.runner import ray_init_args
from fedpriv.run.sweep import job_command

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TINY = [
    "num_clients=3",
    "num_rounds=1",
    "client.steps=2",
    "model=logistic",
    "progress=false",
    "plot=false",
    "save_model=false",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pids_with(marker: str) -> set[int]:
    """Processes whose command line contains ``marker``, and all their descendants."""
    parent: dict[int, int] = {}
    roots = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = (
                Path(f"/proc/{entry}/cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode(errors="replace")
            )
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
        if marker in cmd:
            roots.add(int(entry))
    found, grew = set(roots), True
    while grew:
        new = {pid for pid, ppid in parent.items() if ppid in found} - found
        found |= new
        grew = bool(new)
    found.discard(os.getpid())
    return found


def _stop(pids: set[int]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
            time.sleep(0.2)


def _ray_start(args: list[str], temp_dir: str) -> None:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    common = [
        f"--temp-dir={temp_dir}",
        f"--dashboard-agent-listen-port={_free_port()}",
        "--disable-usage-stats",
        "--object-store-memory=100000000",
        f"--runtime-env-agent-port={_free_port()}",
        f"--metrics-export-port={_free_port()}",
    ]
    proc = subprocess.run(
        [str(BIN / "ray"), "start", *args, *common],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A head and a second node with 1 CPU each; yields the head's ``HOST:PORT``."""
    temp_dir = tempfile.mkdtemp(
        prefix="fpr_", dir="/tmp"
    )  # short: Ray's socket paths must fit 107 bytes
    try:
        _ray_start(
            [
                "--head",
                f"--port={_free_port()}",
                "--num-cpus=1",
                "--include-dashboard=false",
                f"--dashboard-port={_free_port()}",
                f"--ray-client-server-port={_free_port()}",
            ],
            temp_dir,
        )
        address = Path(temp_dir, "ray_current_cluster").read_text().strip()
        _ray_start([f"--address={address}", "--num-cpus=1"], temp_dir)
        yield address
    finally:
        _stop(_pids_with(temp_dir))
        shutil.rmtree(temp_dir, ignore_errors=True)


def _fedpriv(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.run(
        [sys.executable, "-m", "fedpriv.cli.experiment", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _pld_epsilon(sigma: float, q: float, steps: int, delta: float) -> float:
    """Independent ε: dp-accounting's PLD accountant composed directly."""
    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    return acc.get_epsilon(delta)


@pytest.mark.slow
def test_sweep_on_two_node_cluster_and_report(cluster: str, tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    proc = _fedpriv(
        [
            "-m",
            "hydra/launcher=ray",
            "privacy.noise_multiplier=0.8,1.2",
            "seed=0,1",
            *TINY,
            f"ray_init_args.address={cluster}",
            f"hydra.sweep.dir={sweep_dir}",
        ]
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = json.loads((sweep_dir / "sweep.json").read_text())["jobs"]
    assert len(jobs) == 4 and all(j["status"] == "complete" for j in jobs), jobs
    # 4 one-CPU jobs on 1 + 1 CPUs: two waited in Ray's queue, and both nodes ran jobs
    assert len({j["node"] for j in jobs}) == 2, jobs
    for job in jobs:
        res = json.loads(Path(job["dir"], "results.json").read_text())
        sigma = float(
            next(o for o in job["overrides"] if o.startswith("privacy.noise_multiplier=")).split(
                "="
            )[1]
        )
        assert Path(job["dir"]).parent == sweep_dir and res["status"] == "complete"
        # 1 round x 2 local steps of one Poisson-subsampled Gaussian (q=0.1) on the sum, as in
        # test_integration
        assert res["privacy"]["epsilon"] == pytest.approx(
            _pld_epsilon(sigma, 0.1, 2, 1e-5), rel=1e-9
        )
        assert res["privacy"]["noise_multiplier"] == sigma

    report = subprocess.run(
        [str(BIN / "fedpriv-report"), str(sweep_dir)], capture_output=True, text=True, timeout=120
    )
    assert report.returncode == 0, report.stderr
    with (sweep_dir / "report.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    for row, job in zip(rows, jobs, strict=True):
        res = json.loads(Path(job["dir"], "results.json").read_text())
        assert row["status"] == "complete"
        assert float(row["accuracy"]) == pytest.approx(
            res["rounds"][-1]["accuracy"], rel=1e-3
        )  # printed to 4 digits
        assert float(row["epsilon"]) == pytest.approx(res["privacy"]["epsilon"], rel=1e-3)
        assert row["privacy.noise_multiplier"] in ("0.8", "1.2") and row["seed"] in ("0", "1")
    md = (sweep_dir / "report.md").read_text().splitlines()
    assert len(md) == 2 + 4 and "privacy.noise_multiplier" in md[0] and "epsilon" in md[0]
    assert (sweep_dir / "privacy_utility.png").stat().st_size > 0


@pytest.mark.slow
def test_failed_job_is_marked_and_the_sweep_goes_on(cluster: str, tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    proc = _fedpriv(
        [
            "-m",
            "hydra/launcher=ray",
            "privacy.noise_multiplier=1.0,-1",
            *TINY,
            f"ray_init_args.address={cluster}",
            f"hydra.sweep.dir={sweep_dir}",
        ]
    )
    assert proc.returncode == 1
    assert "privacy.noise_multiplier=-1.0 must be >= 0" in proc.stdout
    jobs = {j["num"]: j for j in json.loads((sweep_dir / "sweep.json").read_text())["jobs"]}
    assert jobs[0]["status"] == "complete" and jobs[1]["status"] == "failed"
    assert "privacy.noise_multiplier=-1.0 must be >= 0" in jobs[1]["message"]
    subprocess.run(
        [str(BIN / "fedpriv-report"), str(sweep_dir)], check=True, capture_output=True, timeout=120
    )
    with (sweep_dir / "report.csv").open() as f:
        rows = {r["job"]: r for r in csv.DictReader(f)}
    assert (
        rows["0"]["status"] == "complete"
        and rows["1"]["status"] == "failed"
        and rows["1"]["accuracy"] == ""
    )


@pytest.mark.slow
def test_unreachable_or_missing_address_is_one_clear_message(tmp_path: Path) -> None:
    closed = _free_port()  # nothing listens there
    proc = _fedpriv(
        [
            "-m",
            "hydra/launcher=ray",
            "seed=0,1",
            f"ray_init_args.address=127.0.0.1:{closed}",
            f"hydra.sweep.dir={tmp_path / 'a'}",
        ],
        timeout=120,
    )
    assert proc.returncode != 0
    assert f"cannot reach the Ray cluster at 127.0.0.1:{closed}" in proc.stderr
    proc = _fedpriv(
        ["-m", "hydra/launcher=ray", "seed=0,1", f"hydra.sweep.dir={tmp_path / 'b'}"], timeout=120
    )
    assert proc.returncode != 0 and "needs an existing Ray cluster" in proc.stderr


def test_connect_drops_resource_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    given = {"num_cpus": 2, "object_store_memory": 10**8, "address": None}
    assert ray_init_args(given)["num_cpus"] == 2  # a new local instance keeps its size
    assert ray_init_args({**given, "address": "local"})["object_store_memory"] == 10**8
    joined = ray_init_args({**given, "address": "127.0.0.1:6379"})
    assert (
        joined["address"] == "127.0.0.1:6379"
        and "num_cpus" not in joined
        and "object_store_memory" not in joined
    )
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert "num_cpus" not in ray_init_args(given)


def test_job_command_gives_each_job_its_own_sized_ray_instance() -> None:
    cmd = job_command(
        ["seed=1", "ray_init_args.address=127.0.0.1:6379", "+ray_init_args.num_cpus=8"],
        Path("/abs/sweep/3"),
        cpus=2,
    )
    assert cmd[1:3] == ["-m", "fedpriv.cli.experiment"]
    assert cmd[3:] == [
        "seed=1",
        "hydra.run.dir='/abs/sweep/3'",
        "ray_init_args.address=local",
        "ray_init_args.num_cpus=2",
    ]


@pytest.mark.slow
def test_one_run_spreads_its_workers_over_the_cluster(cluster: str, tmp_path: Path) -> None:
    """Issue 27 item 5: ONE run with ``ray_init_args.address`` places its workers on both
    nodes of the cluster (1 CPU each; ``results.json`` ``engine.ray_nodes``; ``num_workers``
    null: one per client actor of the cluster, 2), and gives the ε and the final model of the
    same run on one local node of 2 CPUs (tolerance 0: same workers, same shares, same
    summation order)."""
    common = ["num_clients=6", "num_rounds=2", "model=logistic", "progress=false", "plot=false"]
    runs = {
        "cluster": [f"ray_init_args.address={cluster}"],
        "local": ["ray_init_args.address=local", "ray_init_args.num_cpus=2", "engine=ray"],
    }
    out = {}
    for name, extra in runs.items():
        run_dir = tmp_path / name
        proc = _fedpriv([*common, *extra, f"hydra.run.dir={run_dir}"])
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        with np.load(run_dir / "model.npz") as model:
            weights = {k: model[k] for k in model.files}
        out[name] = (json.loads((run_dir / "results.json").read_text()), weights)
    (spread, w_spread), (alone, w_alone) = out["cluster"], out["local"]
    assert spread["engine"]["num_workers"] == alone["engine"]["num_workers"] == 2
    assert len(spread["engine"]["ray_nodes"]) == 2, spread["engine"]
    assert len(alone["engine"]["ray_nodes"]) == 1, alone["engine"]
    assert [r["epsilon"] for r in spread["rounds"]] == [r["epsilon"] for r in alone["rounds"]]
    assert w_spread.keys() == w_alone.keys()
    for key in w_spread:
        np.testing.assert_array_equal(w_spread[key], w_alone[key])


@pytest.mark.slow
def test_local_sweep_starts_ray_once(tmp_path: Path) -> None:
    """Issue 27 item 2: the jobs of a local multirun (Hydra's basic launcher) join ONE Ray
    instance (fedpriv/run/warm_engine.py) instead of starting one each, and a job's figures
    equal those of the same run on its own instance (tolerance 0)."""
    sweep_dir = tmp_path / "sweep"
    local = ["ray_init_args.num_cpus=2", "engine=ray"]
    proc = _fedpriv(["-m", "seed=0,1", *TINY, *local, f"hydra.sweep.dir={sweep_dir}"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stderr.count("fedpriv: one Ray instance for this sweep's jobs (2 CPUs)") == 1
    assert "starting Ray (a local instance)" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.count("starting Ray (the cluster at 127.0.0.1:") == 2, proc.stderr
    alone = _fedpriv([*TINY, *local, "seed=1", f"hydra.run.dir={tmp_path / 'alone'}"])
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert "starting Ray (a local instance)" in alone.stderr
    swept, own = (
        json.loads(Path(d, "results.json").read_text())
        for d in (sweep_dir / "1", tmp_path / "alone")
    )
    assert swept["engine"]["num_workers"] == own["engine"]["num_workers"] == 2
    for key in ("epsilon", "accuracy", "loss"):
        assert [r[key] for r in swept["rounds"]] == [r[key] for r in own["rounds"]], key
