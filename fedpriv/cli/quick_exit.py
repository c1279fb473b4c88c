"""End a command-line process without tearing its modules down one by one.

A ``fedpriv`` process holds some 3,000 modules (torch, Flower, SciPy, Hydra); the
interpreter's orderly shut-down frees them one by one, 0.8 s on a 2-core machine, after the
run's files are written. :func:`quick_exit` flushes the streams and the log handlers, runs
the ``atexit`` handlers (Ray's shut-down, multiprocessing's children), then ends the process
with ``os._exit``. Only console-script entry points call it: an in-process caller of
:func:`fedpriv.cli.experiment.main` keeps its interpreter.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from collections.abc import Callable
from typing import NoReturn


def exit_status(code: object) -> int:
    """The process status of ``SystemExit(code)``: ``None`` 0, an int itself, anything else
    printed to stderr and 1 (as the interpreter does)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def quick_exit(code: int) -> NoReturn:
    """Flush, run the ``atexit`` handlers, and end the process with status ``code``."""
    logging.shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said on it
            pass
    os._exit(code)


def run_then_exit(main: Callable[[], object]) -> NoReturn:
    """``main()``, then :func:`quick_exit` with its status (0, or its ``SystemExit``'s)."""
    try:
        main()
    except SystemExit as exc:
        quick_exit(exit_status(exc.code))
    quick_exit(0)
