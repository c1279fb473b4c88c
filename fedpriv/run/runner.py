"""Runs one experiment: plans it, starts the Flower simulation engine (Ray backend) with the
server strategy and the client app, and records accuracy and ε every round.

:func:`run_experiment` is the whole run; each step is a function of its own: :func:`open_run`
(the run directory, its lock, a resumed checkpoint), :func:`make_recorder` (``results.json``'s
privacy block), :func:`make_job` (the strategy's typed job), :func:`simulate` (the engine).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.task_identity import TaskIdentity
from omegaconf import DictConfig, OmegaConf

from fedpriv.accounting.secure_mode import secure_accounting, secure_accounting_line
from fedpriv.common.notices import quiet_known_notices
from fedpriv.data.shared import unshare
from fedpriv.report.display import RoundDisplay
from fedpriv.report.results import RunRecorder
from fedpriv.run import checkpoint
from fedpriv.run.algorithm import ClientAlgorithm
from fedpriv.run.client_app import make_client_app
from fedpriv.run.header import NON_PRIVATE_WARNING, header_line, noise_facts, secure_mode_warning
from fedpriv.run.job import ServerJob
from fedpriv.run.layout import Layout, local_actors
from fedpriv.run.plan import Engine, RunPlan
from fedpriv.run.prepare import build_server, central_analysis, prepare, run_layout
from fedpriv.run.process_grid import RUN_ID, ProcessGrid
from fedpriv.run.ray_session import release_stuck_clients, running_ray, start_ray
from fedpriv.run.resume import not_resumable
from fedpriv.run.round_log import RoundLog
from fedpriv.run.run_privacy import RunPrivacy
from fedpriv.run.setup import run_dataset, share_run_dataset
from fedpriv.run.strategy import Strategy
from fedpriv.run.warm_engine import warm_address

DEFAULT_RAY_INIT = {"include_dashboard": False, "logging_level": "ERROR", "log_to_driver": True}


@dataclass
class OpenRun:
    """A run directory being written: its lock, and the checkpoint it resumes (if any)."""

    out_dir: Path
    lock: IO[str]
    ckpt: checkpoint.Checkpoint | None
    grid: ProcessGrid | None = None


def run_experiment(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
    """Run the configured experiment; write outputs into ``out_dir``; return the summary.

    Raises
    ------
    ConfigError
        On invalid configuration, before any output is written.
    """
    plan, algorithm = prepare(cfg)
    strategy, aggregator = build_server(plan, algorithm)
    analysis = central_analysis(plan)  # prepare() checked the accountant and the budget
    with _startup_signals():
        run = open_run(plan, strategy, Path(out_dir))
        shared = share_run_dataset(plan)  # one mapped copy of a large training set
        recorder = make_recorder(plan, algorithm, analysis, run)
        layout = run_layout(plan)
        run.grid = fork_workers(plan, layout)
        job = make_job(plan, algorithm, aggregator, strategy, recorder, layout, run)
        job.note(header_line(plan, noise_facts(algorithm), analysis, run.out_dir, layout))
        if job.audit is not None:
            job.note(job.audit.header())
        start(job, run, strategy)
    status, message = "failed", ""
    t0 = time.monotonic()
    try:
        with job.log.display, _graceful_stop(job):
            simulate(job, strategy, layout, run.grid)
        failed = sum(r.get("status") == "failed" for r in recorder.rounds)
        status = "stopped" if job.stop_reason else "complete"
        message = job.stop_reason or (f"{failed} round(s) failed" if failed else "")
    except BaseException as exc:
        message = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        finish(job, run, shared, status, message, time.monotonic() - t0)
    return {
        "status": status,
        "exit_code": exit_code(status, job.stop_signal),
        "message": message,
        "rounds": recorder.rounds,
        "privacy": recorder.privacy,
        "wall_time_s": recorder.extra["wall_time_s"],
    }


def open_run(plan: RunPlan, strategy: Strategy, out_dir: Path) -> OpenRun:
    """Lock the run directory (``resume=``: the saved run's, its checkpoint loaded) and start
    Ray before any output is written (its faults leave no ``results.json``).

    Raises
    ------
    ConfigError
        For a strategy without checkpoints asked to resume, a locked or missing directory, or
        a Ray instance that cannot start.
    """
    ckpt = None
    if plan.resume:  # fedpriv resume=RUN_DIR: continue in place (fedpriv.run.checkpoint)
        out_dir = Path(plan.resume)
        if not type(strategy).resumable:
            raise not_resumable(str(out_dir), type(strategy).__name__)
        ckpt = checkpoint.load(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lock = checkpoint.lock_run(out_dir, "resume" if ckpt is not None else "hydra.run.dir")
    try:
        if run_layout(plan).engine is Engine.RAY:
            warm = warm_address(plan.ray_init_args)  # a local sweep's one instance, if any
            given = {**plan.ray_init_args, "address": warm} if warm else dict(plan.ray_init_args)
            start_ray(ray_init_args(given), plan_resources(plan), plan.ray_connect_timeout_s)
    except BaseException:
        lock.close()
        raise
    return OpenRun(out_dir, lock, ckpt)


def fork_workers(plan: RunPlan, layout: Layout) -> ProcessGrid | None:
    """The worker processes of an ``engine=processes`` run, forked now, before the display's
    thread starts (``None`` on Ray): one per worker node, at most one per client actor the
    CPUs allow for one node per client."""
    if layout.engine is not Engine.PROCESSES:
        return None
    actors = local_actors(plan) or 1
    procs = min(layout.num_workers, actors)
    return ProcessGrid(make_client_app(plan), layout.num_workers, procs)


def plan_resources(plan: RunPlan) -> dict[str, float]:
    """``client_resources`` of the plan, as Flower's backend config takes them."""
    return {"num_cpus": plan.num_cpus, "num_gpus": plan.num_gpus}


def make_recorder(
    plan: RunPlan, algorithm: ClientAlgorithm, analysis: str, run: OpenRun
) -> RunRecorder:
    """The run's :class:`RunRecorder`: ``config_resolved.yaml`` written, the ``privacy`` block
    of ``results.json`` (the spec's summary, the run's participation, what answers for ε, the
    noise facts; on resume the saved ε and ledger), the rows of a resumed run."""
    facts = noise_facts(algorithm)
    if warning := secure_mode_warning(algorithm):
        print(warning, file=sys.stderr)
    if facts["non_private"]:
        print(NON_PRIVATE_WARNING, file=sys.stderr)
    secure = secure_accounting(plan.privacy, plan.num_rounds)
    if line := secure_accounting_line(secure, plan.num_rounds):
        print(line, file=sys.stderr)
    config = {**plan.to_config(), "resume": None}
    (run.out_dir / "config_resolved.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(config)))
    saved = {} if run.ckpt is None else run.ckpt.meta
    cohort = plan.cohort
    privacy = {
        "epsilon": 0.0,
        "delta": plan.privacy.target_delta,
        "accounting": analysis,
        "num_rounds": plan.num_rounds,
        "num_clients": plan.num_clients,
        "client_sampling": cohort.client_sampling.value,
        "client_sample_rate": cohort.client_sample_rate,
        "num_sampled_clients": cohort.num_sampled_clients,
        **algorithm.privacy_summary(),
        **facts,
        **secure,
        **{
            k: saved["recorder_privacy"][k]
            for k in ("epsilon", "local_epsilon", "rounds_released", "ledger")
            if k in saved.get("recorder_privacy", {})
        },
    }
    resumed = {} if run.ckpt is None else {"resumed": [*saved.get("resumed", []), run.ckpt.round]}
    data = run_dataset(plan)
    return RunRecorder(
        run.out_dir,
        privacy=privacy,
        extra={"config": config, "dataset": {"name": data.name, "provenance": data.provenance}}
        | resumed,
        resume_rounds=None if run.ckpt is None else list(saved.get("rows", [])),
    )


def make_job(
    plan: RunPlan,
    algorithm: ClientAlgorithm,
    aggregator: Any,
    strategy: Strategy,
    recorder: RunRecorder,
    layout: Layout,
    run: OpenRun,
) -> ServerJob:
    """The strategy's :class:`ServerJob`, its :class:`RoundLog` checkpointing into the run
    directory when the strategy is resumable."""
    display = RoundDisplay(plan.num_rounds, enabled=plan.progress)
    privacy = RunPrivacy(plan.privacy, plan.cohort.nominal_size)
    ckpt_dir = run.out_dir if type(strategy).resumable else None
    log = RoundLog(privacy, recorder, display, ckpt_dir, secure=plan.secure_mode)
    log.strategy_state = strategy.saved_state
    job = ServerJob(plan, algorithm, aggregator, layout, log)
    if job.audit is not None:
        recorder.update_privacy(**job.audit.summary)
    return job


def start(job: ServerJob, run: OpenRun, strategy: Strategy) -> None:
    """The checkpoint before round 1, or the resumed state (ledgers, model, strategy state;
    in secure mode a round started after the checkpoint is accounted as released)."""
    if run.ckpt is None:
        job.save_checkpoint(0)
        return
    ckpt = run.ckpt
    job.round_config = job.log.restore(ckpt.meta)
    job.first_round = ckpt.round + 1
    job.state = {k: v.copy() for k, v in ckpt.model.items()}
    strategy.restore_saved_state(ckpt.strategy)
    job.note(
        f"resuming after round {ckpt.round} of {job.num_rounds} "
        f"(epsilon so far {job.privacy.epsilon():.4g})"
    )
    lost = checkpoint.lost_round(run.out_dir, ckpt) if job.plan.secure_mode else None
    if lost is not None:
        job.log.lost(lost)
        job.save_checkpoint(ckpt.round)
    job.log.display.progress.update(job.log.display.task, completed=ckpt.round)


def simulate(
    job: ServerJob, strategy: Strategy, layout: Layout, grid: ProcessGrid | None = None
) -> None:
    """Run the Flower simulation: the server app runs ``strategy.start`` on the job; the
    client app trains the clients (:func:`fedpriv.run.client_app.make_client_app`) on the
    worker processes of ``grid``, or on Flower's Ray backend when it is ``None``."""
    if grid is not None:
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = RUN_ID, 0, 0
        job.state = strategy.start(grid, job)  # type: ignore[arg-type]
        return
    server_app = ServerApp()
    done = threading.Event()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            job.state = strategy.start(grid, job)
        finally:  # a timed-out client must not keep the finished run waiting
            release_stuck_clients(done)

    backend = {
        "client_resources": plan_resources(job.plan),
        "init_args": ray_init_args(dict(job.plan.ray_init_args)),
    }
    _run_simulation(server_app, make_client_app(job.plan), layout.num_workers, backend)
    done.set()


def finish(
    job: ServerJob, run: OpenRun, shared: Path | None, status: str, message: str, seconds: float
) -> None:
    """End the run: Ray down, the shared dataset removed, the results written with
    ``status`` (the model and the plot as configured), the lock released."""
    if run.grid is not None:
        run.grid.close()
    _stop_ray()
    unshare(shared)
    recorder = job.log.recorder
    recorder.extra["wall_time_s"] = job.log.wall_before + seconds
    recorder.finish(
        status,
        message,
        weights=job.state if job.plan.save_model else None,
        plot=job.plan.plot,
    )
    run.lock.close()


def exit_code(status: str, stop_signal: int = 0) -> int:
    """The process exit code of a run that ended with ``status``: 0 only for ``complete``;
    a ``stopped`` run exits 128 + the signal that stopped it, or 3 (stopped by
    ``privacy.stop_at_epsilon``); ``failed`` exits 1 (a refused config exits 2)."""
    if status == "complete":
        return 0
    if status == "stopped":
        return 128 + stop_signal if stop_signal else 3
    return 1


# ray.init arguments that configure a NEW local instance (an existing cluster rejects them)
RAY_RESOURCE_ARGS = (
    "num_cpus",
    "num_gpus",
    "resources",
    "labels",
    "object_store_memory",
    "_memory",
    "_system_config",
    "_node_name",
    "_enable_object_reconstruction",
)


def ray_init_args(given: dict[str, Any] | None) -> dict[str, Any]:
    """``ray.init`` keyword arguments: the defaults, then ``given`` without null values.

    When ``address`` (or, if it is null, the ``RAY_ADDRESS`` environment variable) names an
    existing cluster (anything but ``"local"``), the resource-sizing arguments
    (:data:`RAY_RESOURCE_ARGS`) are dropped: Ray refuses them on connect, and the cluster's
    own resources apply. With neither, ``address`` is ``"local"``: a new local instance, never
    a cluster that some earlier ``ray start`` left on the machine (Ray's own default joins it).
    """
    args = {**DEFAULT_RAY_INIT, **{k: v for k, v in (given or {}).items() if v is not None}}
    address = args.get("address") or os.environ.get("RAY_ADDRESS") or "local"
    if address != "local":
        return {k: v for k, v in args.items() if k not in RAY_RESOURCE_ARGS}
    return {**args, "address": "local"}


@contextlib.contextmanager
def _on_stop_signals(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """Inside the block SIGINT and SIGTERM call ``handler`` (the previous handlers come back
    after it). Off the main thread, where Python installs no handler, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


@contextlib.contextmanager
def _graceful_stop(job: ServerJob) -> Iterator[None]:
    """First SIGINT/SIGTERM: finish the round in progress, save everything, stop (status
    ``stopped``, exit code 128 + the signal's number). A second one aborts at once
    (:class:`RunAborted`; the run is saved as ``failed``)."""

    def handler(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if job.interrupted:
            raise RunAborted(f"aborted by a second signal ({name}) during the run")
        job.interrupted, job.stop_signal = name, int(signum)
        job.note(f"{name}: stopping after this round (send it again to abort now)")

    with _on_stop_signals(handler):
        yield


class RunAborted(KeyboardInterrupt):
    """A second SIGINT/SIGTERM: the run stops at once, saved with status ``failed``."""


class StartupInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM before the first round: nothing was trained or released.

    Attributes
    ----------
    signum : int
        The signal's number (the process exits 128 + it).
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


@contextlib.contextmanager
def _startup_signals() -> Iterator[None]:
    """While Ray starts and the run is set up, SIGINT and SIGTERM raise
    :class:`StartupInterrupted` (the caller exits 128 + the signal with one line).

    ``ray.init`` replaces the SIGTERM handler with ``sys.exit(SIGTERM)``; that exit, raised
    during start-up, is the same interruption."""

    def handler(signum: int, frame: Any) -> None:
        raise StartupInterrupted(signum)

    try:
        with _on_stop_signals(handler):
            yield
    except SystemExit as exc:
        if exc.code == signal.SIGTERM:
            raise StartupInterrupted(signal.SIGTERM) from None
        raise


def _stop_ray() -> None:
    """Shut the run's Ray instance down (its processes end with the run)."""
    ray = running_ray()
    if ray is not None:
        ray.shutdown()


def _run_simulation(
    server_app: ServerApp, client_app: Any, num_nodes: int, backend: dict[str, Any]
) -> None:
    from flwr.simulation import run_simulation

    logging.getLogger("flwr").setLevel(logging.WARNING)
    quiet_known_notices()
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=num_nodes,
        backend_config=backend,
    )
