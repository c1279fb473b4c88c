"""A process that runs ``fedpriv`` commands one after another, in-process (tests/cli.py).

It reads one JSON request per line on stdin (``{"args": [...], "cwd": "..."}``) and answers
each on stdout with one line ``MARKER {"code", "stdout", "stderr"}``; anything else the
command prints goes to the captured streams. It imports fedpriv once, so a command costs
what the command does, not an interpreter start with torch and dp-accounting.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys

MARKER = "@@fedpriv-cli-worker@@"


def run_one(args: list[str], cwd: str) -> dict[str, object]:
    from hydra.core.global_hydra import GlobalHydra

    from fedpriv.cli.experiment import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    old_argv, old_cwd = sys.argv, os.getcwd()
    root_handlers = list(logging.getLogger().handlers)
    sys.argv = ["fedpriv", *args]
    os.chdir(cwd)
    GlobalHydra.instance().clear()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        GlobalHydra.instance().clear()
        sys.argv = old_argv
        os.chdir(old_cwd)
        for h in logging.getLogger().handlers:
            if h not in root_handlers:
                h.close()
        logging.getLogger().handlers[:] = root_handlers
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def serve() -> None:
    real = sys.__stdout__
    for line in sys.stdin:
        request = json.loads(line)
        answer = run_one(list(request["args"]), str(request["cwd"]))
        real.write(f"{MARKER} {json.dumps(answer)}\n")
        real.flush()


if __name__ == "__main__":
    serve()
