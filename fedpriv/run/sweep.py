"""Sweeps on an existing Ray cluster: every Hydra job becomes one Ray task.

The Hydra launcher ``hydra/launcher=ray`` (``hydra_plugins/fedpriv_ray_launcher``) calls
:func:`launch_on_cluster`. Each job is a Ray task that reserves ``cpus_per_job`` CPUs (and
``gpus_per_job`` GPUs) on some node of the cluster; Ray's scheduler decides where and when, so
a sweep with more jobs than CPUs queues and always makes progress. The task runs the job as
``python -m fedpriv.cli.experiment OVERRIDES hydra.run.dir=JOB_DIR`` in a child process whose Flower
simulation gets its OWN Ray instance of exactly the reserved CPUs
(``ray_init_args.address=local ray_init_args.num_cpus=cpus_per_job``). Why not Flower actors
on the shared cluster: Flower 1.42 sizes its actor pool to every CPU of the cluster
(``flwr.simulation.ray_transport.ray_actor.pool_size_from_resources``), so two simulations
sharing a cluster each create a full pool, half their actors stay pending, and each waits
for the other to finish: a deadlock. A job's own instance keeps its pool to what it holds.

Every job writes into ``SWEEP_DIR/<hydra.job.num>`` (absolute paths: a Ray worker's working
directory is not the caller's), plus ``job.log`` (the child's output). ``SWEEP_DIR/sweep.json``
lists every job with its overrides, status, wall time and node, and is updated as jobs end.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fedpriv.common.errors import check
from fedpriv.report.sweep_report import MANIFEST

# overrides the launcher sets itself for every job (a user's value for them is dropped)
OWN_KEYS = (
    "hydra.run.dir",
    "ray_init_args.address",
    "ray_init_args.num_cpus",
    "ray_init_args.num_gpus",
)


@dataclass
class JobRecord:
    """One job of a sweep, as written to ``sweep.json``."""

    num: int
    overrides: list[str]
    dir: str
    status: str = "pending"  # pending | complete | stopped | failed
    returncode: int | None = None
    wall_time_s: float | None = None
    node: str = ""
    message: str = ""


@dataclass(frozen=True)
class ClusterLaunchConfig:
    """Options of the ``ray`` launcher (``hydra.launcher.*``).

    Parameters
    ----------
    address : str or None
        The existing cluster: ``HOST:PORT`` (the head's GCS port), ``ray://HOST:10001`` or
        ``auto``; ``None`` reads ``RAY_ADDRESS``.
    cpus_per_job : int
        CPUs a job reserves on the cluster, and the size of its own Ray instance (its Flower
        actor pool is ``cpus_per_job / client_resources.num_cpus`` actors), >= 1.
    gpus_per_job : float
        GPUs a job reserves (Ray sets ``CUDA_VISIBLE_DEVICES`` for it), >= 0.
    job_timeout_s : float or None
        Seconds after which a job is killed and marked failed; ``None``: no limit.
    connect_timeout_s : float
        Seconds to wait for the cluster's address to answer before giving up.
    """

    address: str | None = None
    cpus_per_job: int = 1
    gpus_per_job: float = 0.0
    job_timeout_s: float | None = None
    connect_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        check(
            isinstance(self.cpus_per_job, int) and self.cpus_per_job >= 1,
            "hydra.launcher.cpus_per_job",
            self.cpus_per_job,
            "must be an integer >= 1",
        )
        check(
            self.gpus_per_job >= 0, "hydra.launcher.gpus_per_job", self.gpus_per_job, "must be >= 0"
        )
        if self.job_timeout_s is not None:
            check(
                self.job_timeout_s > 0,
                "hydra.launcher.job_timeout_s",
                self.job_timeout_s,
                "must be > 0 (seconds)",
            )
        check(
            self.connect_timeout_s > 0,
            "hydra.launcher.connect_timeout_s",
            self.connect_timeout_s,
            "must be > 0",
        )


def cluster_address(configured: str | None) -> str:
    """The cluster address to join: ``configured``, else ``$RAY_ADDRESS``.

    Raises
    ------
    ConnectionError
        If neither is set (a sweep never starts a private local cluster by accident).
    """
    address = configured or os.environ.get("RAY_ADDRESS") or ""
    if not address or address == "local":
        raise ConnectionError(
            "hydra/launcher=ray needs an existing Ray cluster: set ray_init_args.address=HOST:PORT "
            "(or RAY_ADDRESS); start one with `ray start --head --port=6379`"
        )
    return address


def check_reachable(address: str, timeout: float) -> None:
    """Fail fast with a clear message if ``address`` (``[ray://]HOST:PORT``) does not answer.

    ``auto`` is left to Ray. Raises :class:`ConnectionError`.
    """
    if address == "auto":
        return
    from fedpriv.run.ray_session import unreachable_reason

    try:
        reason = unreachable_reason(address, timeout)
    except ValueError as exc:
        raise ConnectionError(str(exc)) from None
    if reason:
        raise ConnectionError(
            f"cannot reach the Ray cluster at {address}: {reason}. Is it running "
            "(`ray status --address=...`)? Start one with `ray start --head --port=PORT`"
        )


def connect(address: str, timeout: float) -> None:
    """``ray.init`` onto the existing cluster at ``address`` (no resource arguments: Ray refuses
    them on connect). Raises :class:`ConnectionError` with a clear message on failure."""
    import ray

    check_reachable(address, timeout)
    if ray.is_initialized():
        return
    try:
        ray.init(
            address=address,
            include_dashboard=False,
            logging_level=logging.ERROR,
            log_to_driver=False,
        )
    except Exception as exc:  # Ray raises ConnectionError/RuntimeError/ValueError here
        raise ConnectionError(
            f"could not join the Ray cluster at {address}: {type(exc).__name__}: {exc}"
        ) from None


def job_command(overrides: list[str], job_dir: Path, cpus: int) -> list[str]:
    """The child command of one job: the ``fedpriv`` CLI with its own Ray instance of ``cpus``
    CPUs."""
    own = [
        f"hydra.run.dir={_quote(str(job_dir))}",
        "ray_init_args.address=local",
        f"ray_init_args.num_cpus={cpus}",
    ]
    user = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] not in OWN_KEYS]
    return [sys.executable, "-m", "fedpriv.cli.experiment", *user, *own]


def _quote(value: str) -> str:
    """A Hydra override value quoted so paths with ``:``, ``=`` or spaces survive."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def run_job(
    overrides: list[str], job_dir: str, cwd: str, cpus: int, timeout: float | None
) -> dict[str, Any]:
    """Body of the Ray task: run one job in a child process; never raises.

    Returns ``{"returncode", "wall_time_s", "node", "message"}``; the child's output goes to
    ``JOB_DIR/job.log``.
    """
    out = Path(job_dir)
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    t0 = time.monotonic()
    with open(out / "job.log", "w") as log:
        try:
            proc = subprocess.run(
                job_command(overrides, out, cpus),
                cwd=cwd if Path(cwd).is_dir() else None,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout,
            )
            rc, message = proc.returncode, ""
        except subprocess.TimeoutExpired:
            rc, message = -9, f"killed after job_timeout_s={timeout}"
        except OSError as exc:
            rc, message = -1, f"could not start: {exc}"
    if rc != 0 and not message:
        message = _last_error_line(out / "job.log") or f"exit code {rc}"
    return {
        "returncode": rc,
        "wall_time_s": time.monotonic() - t0,
        "node": _node(),
        "message": message,
    }


def _node() -> str:
    """``host/ray-node-id`` of the node running the task (the host alone outside Ray)."""
    try:
        import ray

        return f"{socket.gethostname()}/{ray.get_runtime_context().get_node_id()[:12]}"
    except Exception:
        return socket.gethostname()


def _last_error_line(log: Path) -> str:
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("fedpriv: "):
            return ln
    return lines[-1] if lines else ""


def job_status(job_dir: Path, returncode: int) -> str:
    """``stopped`` or ``complete`` (exit 0 only) from the job's ``results.json``, else
    ``failed``."""
    try:
        status = json.loads((job_dir / "results.json").read_text()).get("status", "failed")
    except (OSError, ValueError):
        return "failed"
    if status == "stopped":  # a stopped run exits non-zero (0 is for complete runs only)
        return status
    return status if returncode == 0 and status == "complete" else "failed"


def write_manifest(sweep_dir: Path, jobs: list[JobRecord]) -> None:
    """Write ``SWEEP_DIR/sweep.json`` atomically."""
    path = sweep_dir / MANIFEST
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"jobs": [asdict(j) for j in jobs]}, indent=2))
    os.replace(tmp, path)


def _check_fits(cfg: ClusterLaunchConfig) -> None:
    """Refuse a job size no node can hold (Ray would queue it forever)."""
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive") and n.get("Resources")]
    fits = any(
        r.get("CPU", 0) >= cfg.cpus_per_job and r.get("GPU", 0) >= cfg.gpus_per_job for r in nodes
    )
    have = [(r.get("CPU", 0), r.get("GPU", 0)) for r in nodes]
    check(
        fits,
        "hydra.launcher.cpus_per_job",
        cfg.cpus_per_job,
        f"with gpus_per_job={cfg.gpus_per_job} fits on no node of the cluster "
        f"(CPUs, GPUs per node: {have})",
    )


def launch_on_cluster(
    jobs: list[JobRecord], sweep_dir: Path, cwd: str, cfg: ClusterLaunchConfig, echo: Any = print
) -> list[JobRecord]:
    """Run ``jobs`` as Ray tasks on the cluster at ``cfg.address`` and wait for all of them.

    A failed job is recorded (``status="failed"`` and a message) and the others go on.

    Raises
    ------
    ConnectionError
        If the cluster address is missing or unreachable (before any job starts).
    ConfigError
        If ``cpus_per_job``/``gpus_per_job`` fit on no node.
    """
    import ray

    address = cluster_address(cfg.address)
    connect(address, cfg.connect_timeout_s)
    _check_fits(cfg)
    task = ray.remote(run_job).options(
        num_cpus=cfg.cpus_per_job, num_gpus=cfg.gpus_per_job, max_retries=0
    )
    pending = {
        task.remote(j.overrides, j.dir, cwd, cfg.cpus_per_job, cfg.job_timeout_s): j for j in jobs
    }
    echo(
        f"fedpriv sweep: {len(jobs)} jobs on the Ray cluster at {address} "
        f"({cfg.cpus_per_job} CPU(s) each); outputs in {sweep_dir}"
    )
    write_manifest(sweep_dir, jobs)
    done = 0
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        job = pending.pop(ready[0])
        try:
            res = ray.get(ready[0])
        except Exception as exc:  # the task itself died (node lost, worker killed)
            res = {
                "returncode": -1,
                "wall_time_s": None,
                "node": "",
                "message": f"{type(exc).__name__}: {exc}",
            }
        job.returncode, job.wall_time_s, job.node = (
            res["returncode"],
            res["wall_time_s"],
            res["node"],
        )
        job.status = job_status(Path(job.dir), job.returncode)
        job.message = res["message"] if job.status == "failed" else ""
        done += 1
        echo(
            f"  [{done}/{len(jobs)}] job {job.num} {job.status}"
            + (f" ({job.wall_time_s:.1f} s)" if job.wall_time_s is not None else "")
            + f": {' '.join(job.overrides)}"
            + (f" -- {job.message}" if job.message else "")
        )
        write_manifest(sweep_dir, jobs)
    failed = [j.num for j in jobs if j.status == "failed"]
    echo(
        f"fedpriv sweep: {len(jobs) - len(failed)} of {len(jobs)} jobs succeeded"
        + (f"; failed: {failed} (see <job dir>/job.log)" if failed else "")
        + f". Report: fedpriv-report {sweep_dir}"
    )
    return jobs
