"""One Ray instance shared by the in-process end-to-end runs that can share it (issue 23,
item 7): each run joins it at ``127.0.0.1:<port>`` instead of starting and stopping a local
instance of its own (about 3.5 s a run on this 2-core machine).

A run on an existing cluster sizes its workers by the cluster, not by ``ray_init_args``
(:func:`fedpriv.run.layout.local_actors`), so :func:`run_shared` pins ``num_workers`` to what
the same run would resolve on its own local instance: the rows are those of an unshared run.
Runs that test Ray's own start, stop, reaper or resources keep their own instance.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest.mock import patch

from omegaconf import DictConfig, open_dict

#: The head: 2 CPUs, as every test run's ``ray_init_args.num_cpus=2``; prints its GCS port.
HEAD = (
    "import ray, sys\n"
    "ray.init(num_cpus=2, include_dashboard=False)\n"
    "print(ray.get_runtime_context().gcs_address.rsplit(':', 1)[1], flush=True)\n"
    "sys.stdin.read()\n"  # until the test session closes the pipe
)


@contextmanager
def ray_head() -> Iterator[str]:
    """A Ray head in a child process for the duration of the block; yields its loopback
    address ``127.0.0.1:<port>``. Ended by closing its stdin, then killed with its group."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HEAD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        port = proc.stdout.readline().strip()
        if not port.isdigit():
            raise RuntimeError(f"the shared Ray head did not start (printed {port!r})")
        yield f"127.0.0.1:{port}"
    finally:
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


def run_shared(cfg: DictConfig, out: Path, address: str) -> dict[str, Any]:
    """:func:`fedpriv.run.runner.run_experiment` of ``cfg`` on the shared instance at
    ``address``, with the ``num_workers`` the run resolves on a local instance of its own."""
    from fedpriv.run.prepare import prepare, run_layout
    from fedpriv.run.runner import run_experiment

    assert "RAY_ADDRESS" not in os.environ, "the local layout is resolved without a cluster"
    layout = run_layout(prepare(cfg)[0])
    if not layout.one_node_per_client:
        cfg = cfg.copy()
        with open_dict(cfg):
            cfg.num_workers = layout.num_workers
    with patch.dict(os.environ, {"RAY_ADDRESS": address}):
        return run_experiment(cfg, out)
