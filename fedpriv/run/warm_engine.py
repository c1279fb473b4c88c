"""One Ray instance for many runs on one machine: the jobs of a local sweep, a test session.

Each fedpriv run starts a local Ray instance and Flower stops it at the end: 2.2-3.4 s to
start and 1.4 s to stop on a 2-core machine (docs/scale.md, "Start-up"). A local multirun
(``fedpriv -m ...`` with Hydra's basic launcher) instead starts ONE head process for its jobs
(:func:`warm_address`), sized as the jobs' local instance would be, and every job joins it at
``127.0.0.1:<port>``: joining costs a connection, and Flower's shut-down only disconnects.
A job is validated and laid out from its own ``ray_init_args`` (a local instance) before it
joins, so its layout and results are those of the same run alone.
Jobs with other Ray settings (an address, a temp dir, object store sizes, custom resources)
start their own instance as before. The head ends with the process (its stdin closes).
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

#: The head: ``ray.init`` with the given CPUs and GPUs; prints its GCS port; runs until its
#: stdin closes.
HEAD = (
    "import ray, sys\n"
    "cpus, gpus = float(sys.argv[1]), (None if sys.argv[2] == 'auto' else float(sys.argv[2]))\n"
    "ray.init(num_cpus=cpus, num_gpus=gpus, include_dashboard=False, logging_level='ERROR')\n"
    "print(ray.get_runtime_context().gcs_address.rsplit(':', 1)[1], flush=True)\n"
    "sys.stdin.read()\n"
)
#: ``ray_init_args`` keys a warm head can stand in for (others: the job starts its own).
WARM_KEYS = frozenset(
    {"address", "num_cpus", "num_gpus", "include_dashboard", "logging_level", "log_to_driver"}
)

_HEADS: dict[tuple[float, float | None], tuple[subprocess.Popen[str], str]] = {}
_ACTIVE: list[bool] = []  # inside sweep_jobs()


def start_head(num_cpus: float, num_gpus: float | None = 0.0) -> tuple[subprocess.Popen[str], str]:
    """A Ray head in a child process of its own session (``num_gpus`` ``None``: the GPUs Ray
    finds); returns it and its loopback address ``127.0.0.1:<port>``.

    Raises
    ------
    RuntimeError
        If the head did not print its port (Ray failed to start).
    """
    proc = subprocess.Popen(
        [sys.executable, "-c", HEAD, str(num_cpus), "auto" if num_gpus is None else str(num_gpus)],
        env={**os.environ, "PYTHONWARNINGS": "ignore"},  # Ray's FutureWarning at init
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    port = proc.stdout.readline().strip()
    if not port.isdigit():
        stop_head(proc)
        raise RuntimeError(f"the shared Ray head did not start (printed {port!r})")
    return proc, f"127.0.0.1:{port}"


def stop_head(proc: subprocess.Popen[str]) -> None:
    """End a head: close its stdin (Ray shuts down), then kill its process group."""
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # Ray's GCS and raylet, should any remain
    except ProcessLookupError:
        pass
    proc.wait()


@contextmanager
def ray_head(num_cpus: float = 2.0, num_gpus: float = 0.0) -> Iterator[str]:
    """A head for the duration of the block; yields its loopback address."""
    proc, address = start_head(num_cpus, num_gpus)
    try:
        yield address
    finally:
        stop_head(proc)


@contextmanager
def sweep_jobs() -> Iterator[None]:
    """Inside the block (a local multirun's job), :func:`warm_address` may start or name the
    sweep's head; outside it, it names none."""
    _ACTIVE.append(True)
    try:
        yield
    finally:
        _ACTIVE.pop()


def warm_address(ray_init_args: Mapping[str, Any]) -> str | None:
    """The address of the process's warm head for a job with these ``ray_init_args``
    (started on first use, stopped at exit), or ``None`` when the job must start its own
    instance: outside :func:`sweep_jobs`, an address or ``RAY_ADDRESS`` given, or a key
    outside :data:`WARM_KEYS`. Called when the job starts Ray, after its config passed."""
    given = {k: v for k, v in ray_init_args.items() if v is not None}
    if not _ACTIVE or os.environ.get("RAY_ADDRESS") or given.get("address", "local") != "local":
        return None
    if set(given) - WARM_KEYS:
        return None
    gpus = given.get("num_gpus")
    key = (float(given.get("num_cpus", os.cpu_count() or 1)), None if gpus is None else float(gpus))
    if key not in _HEADS:
        print(
            f"fedpriv: one Ray instance for this sweep's jobs ({key[0]:g} CPUs) ...",
            file=sys.stderr,
            flush=True,
        )
        proc, address = start_head(*key)
        atexit.register(stop_head, proc)
        _HEADS[key] = (proc, address)
    return _HEADS[key][1]
