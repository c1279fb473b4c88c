"""The local engine: Flower nodes served by worker processes forked from the run's process.

On one machine a run need not start Ray (``ray.init`` takes 2-4 s, its daemons hold 0.34 GiB,
and every actor imports torch, Flower and SciPy again): ``engine=processes`` forks ``P``
worker processes once, before the first round. They share the driver's imported modules and
its read-only pages copy-on-write, and start in milliseconds. The strategy sees the part of
Flower's ``Grid`` that fedpriv's strategies use (``get_node_ids``, ``send_and_receive``);
every reply comes from the same ``ClientApp`` as on Ray
(:func:`fedpriv.run.client_app.make_client_app`), with the node's own ``Context`` (its
``partition-id`` and the ``state`` it keeps between rounds), so a seeded run's results are
the same on both engines.

Faults, as on Flower's Ray backend: a ``ClientApp`` that raises gets an error reply; a process
that dies (killed, out of memory, a crash in native code) gets an error reply naming its exit
code and is replaced; a process still busy when ``send_and_receive``'s timeout ends is killed
and replaced, its message unanswered. Workers ignore SIGINT (a Ctrl-C at the terminal is the
run's to handle: it finishes the round), take SIGTERM's default action, and die with the run
(Linux ``PR_SET_PDEATHSIG``; elsewhere they end when the run's pipe closes).
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import ErrorCode

#: The first node id (Flower's simulation numbers its nodes from random 64-bit ids; any
#: distinct ids do: the strategies only address them).
FIRST_NODE_ID = 1000
#: The run id in the nodes' contexts (one run per grid).
RUN_ID = 1

ClientAppFn = Callable[[Message, Context], Message]


class Worker:
    """One forked worker process and the driver's end of its pipe."""

    def __init__(self, app: ClientAppFn) -> None:
        ctx = mp.get_context("fork")
        self.conn, child = ctx.Pipe()
        args = (child, app, os.getpid())
        self.proc: BaseProcess = ctx.Process(target=serve, args=args, daemon=True)
        self.proc.start()
        child.close()

    def stop(self) -> None:
        """Kill the process (it holds nothing the run needs) and reap it."""
        self.conn.close()
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)


class ProcessGrid:
    """``num_nodes`` Flower nodes served by ``num_procs`` forked worker processes.

    Parameters
    ----------
    app : callable
        The ``ClientApp`` (``app(message, context) -> reply``), run in the workers.
    num_nodes : int
        Flower nodes (ids ``FIRST_NODE_ID + i``, ``partition-id`` ``i``), >= 1.
    num_procs : int
        Worker processes, >= 1; a message goes to the first idle one.

    Raises
    ------
    ValueError
        For ``num_nodes`` or ``num_procs`` below 1.
    """

    def __init__(self, app: ClientAppFn, num_nodes: int, num_procs: int) -> None:
        if num_nodes < 1 or num_procs < 1:
            raise ValueError(f"num_nodes={num_nodes} and num_procs={num_procs} must be >= 1")
        self.app = app
        self.node_ids = [FIRST_NODE_ID + i for i in range(num_nodes)]
        self.contexts = {
            nid: node_context(nid, i, num_nodes) for i, nid in enumerate(self.node_ids)
        }
        self.workers = [Worker(app) for _ in range(num_procs)]

    def get_node_ids(self) -> list[int]:
        """The ids of the nodes (all registered from the start)."""
        return list(self.node_ids)

    def send_and_receive(
        self, messages: Sequence[Message], *, timeout: float | None = None
    ) -> list[Message]:
        """Run ``messages`` on the workers; the replies that came within ``timeout`` seconds
        (``None``: no limit), in the order they came."""
        pending = list(messages)
        busy: dict[Worker, Message] = {}
        replies: list[Message] = []
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending or busy:
            for worker in [w for w in self.workers if w not in busy]:
                if pending:
                    msg = pending.pop(0)
                    worker.conn.send((msg, self.contexts[msg.metadata.dst_node_id]))
                    busy[worker] = msg
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            ready = set(wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], left))
            for worker in [w for w in busy if w.conn in ready or w.proc.sentinel in ready]:
                replies.append(self._collect(worker, busy.pop(worker)))
        for worker in busy:  # past the deadline: its message goes unanswered
            self._replace(worker)
        return replies

    def _collect(self, worker: Worker, msg: Message) -> Message:
        """``worker``'s reply to ``msg``, or an error reply if it died (then replaced)."""
        try:
            reply, context = worker.conn.recv()
        except (EOFError, OSError):
            worker.proc.join(timeout=5)
            code = worker.proc.exitcode
            self._replace(worker)
            nid = msg.metadata.dst_node_id
            reason = f"worker process died (exit code {code}) serving node {nid}"
            return Message(Error(code=ErrorCode.UNKNOWN, reason=reason), reply_to=msg)
        self.contexts[msg.metadata.dst_node_id] = context
        return reply  # type: ignore[no-any-return]

    def _replace(self, worker: Worker) -> None:
        worker.stop()
        self.workers[self.workers.index(worker)] = Worker(self.app)

    def close(self) -> None:
        """Stop every worker process."""
        for worker in self.workers:
            worker.stop()
        self.workers = []


def node_context(node_id: int, partition_id: int, num_nodes: int) -> Context:
    """A node's ``Context`` as Flower's simulation makes it (``partition-id``,
    ``num-partitions``, an empty ``state``)."""
    config = {"partition-id": partition_id, "num-partitions": num_nodes}
    return Context(RUN_ID, node_id, config, RecordDict(), {})  # type: ignore[arg-type]


def serve(conn: Connection, app: ClientAppFn, parent: int) -> None:
    """A worker's loop: ``(message, context)`` in, ``(reply, context)`` out, until the pipe
    closes or the run (process ``parent``) is gone. A ``ClientApp`` that raises gets Flower's
    error reply."""
    die_with_parent()
    if os.getppid() != parent:  # the run died before the death signal was armed
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    while True:
        try:
            msg, context = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply = app(msg, context)
        except Exception as exc:  # as Flower's simulation: the error travels as the reply
            reason = f"{type(exc)}:<'{exc}'>"
            error = Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason)
            reply = Message(error, reply_to=msg)
        conn.send((reply, context))


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
