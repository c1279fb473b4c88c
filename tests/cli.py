"""The ``fedpriv`` command for tests of its one-line refusals, without an interpreter start per
command: one worker process (tests/cli_worker.py) imports fedpriv once and runs each command
in-process with the same ``main()`` a shell runs. Tests of what only a fresh process shows
(signals, a killed run, the console script, the reaper) still start their own."""

from __future__ import annotations

import atexit
import json
import subprocess
import sys
from pathlib import Path

from tests.cli_worker import MARKER

REPO = Path(__file__).resolve().parents[1]
_WORKER: list[subprocess.Popen[str]] = []


def _worker() -> subprocess.Popen[str]:
    if _WORKER and _WORKER[0].poll() is None:
        return _WORKER[0]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.cli_worker"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    _WORKER[:] = [proc]
    atexit.register(proc.kill)
    return proc


def run_fedpriv(args: list[str], cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """``fedpriv ARGS`` (from ``cwd``): its exit code, stdout and stderr.

    Raises
    ------
    RuntimeError
        If the worker process died (it is restarted for the next command).
    """
    proc = _worker()
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps({"args": args, "cwd": str(cwd)}) + "\n")
    proc.stdin.flush()
    for line in proc.stdout:
        if line.startswith(MARKER):
            answer = json.loads(line[len(MARKER) :])
            return subprocess.CompletedProcess(
                ["fedpriv", *args], answer["code"], answer["stdout"], answer["stderr"]
            )
    raise RuntimeError(f"the fedpriv worker process died running {args}")
