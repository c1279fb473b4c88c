"""The local engine's grid (fedpriv.run.process_grid): forked workers behind Flower's Grid.

Each test drives real forked processes with a small ClientApp callable and Flower messages;
the end-to-end identity with the Ray engine is in tests/test_engines.py.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

from fedpriv.run.process_grid import FIRST_NODE_ID, ProcessGrid


def _app(msg: Message, context: Context) -> Message:
    """Counts its calls per node in ``context.state``; obeys the message's ``do``."""
    do = str(msg.content.config_records["c"]["do"])
    if do == "raise":
        raise ValueError("boom")
    if do == "die":
        os._exit(7)
    if do == "sleep":
        time.sleep(30)
    if do == "sigint":
        os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C at the terminal reaches the workers
    calls = context.state.config_records.get("n", ConfigRecord({"calls": 0}))
    calls["calls"] = int(str(calls["calls"])) + 1
    context.state.config_records["n"] = calls
    reply = {
        "pid": os.getpid(),
        "calls": calls["calls"],
        "partition": context.node_config["partition-id"],
    }
    return Message(RecordDict({"r": ConfigRecord(reply)}), reply_to=msg)  # type: ignore[arg-type]


def _msg(node: int, do: str = "ok") -> Message:
    content = RecordDict({"c": ConfigRecord({"do": do})})
    return Message(content=content, dst_node_id=node, message_type=MessageType.TRAIN)


def _reply(reply: Message) -> dict[str, Any]:
    assert not reply.has_error(), reply.error.reason
    return dict(reply.content.config_records["r"])


@pytest.fixture()
def grid(task_identity: None) -> Any:
    grid = ProcessGrid(_app, num_nodes=3, num_procs=2)
    yield grid
    grid.close()


def test_every_node_replies_with_its_own_context(grid: ProcessGrid) -> None:
    nodes = grid.get_node_ids()
    assert nodes == [FIRST_NODE_ID, FIRST_NODE_ID + 1, FIRST_NODE_ID + 2]
    for round_ in (1, 2):
        replies = grid.send_and_receive([_msg(n) for n in nodes], timeout=30)
        by_node = {r.metadata.src_node_id: _reply(r) for r in replies}
        assert sorted(by_node) == nodes
        for i, n in enumerate(nodes):  # the node's state survives the round, whichever process
            assert by_node[n]["partition"] == i
            assert by_node[n]["calls"] == round_
    pids = {_reply(r)["pid"] for r in grid.send_and_receive([_msg(n) for n in nodes])}
    assert pids <= {w.proc.pid for w in grid.workers} and os.getpid() not in pids


def test_a_raising_app_gets_an_error_reply_and_the_others_reply(grid: ProcessGrid) -> None:
    a, b, c = grid.get_node_ids()
    replies = grid.send_and_receive([_msg(a, "raise"), _msg(b), _msg(c)], timeout=30)
    errors = [r for r in replies if r.has_error()]
    assert len(replies) == 3 and len(errors) == 1
    assert errors[0].metadata.src_node_id == a and "ValueError" in errors[0].error.reason
    assert "boom" in errors[0].error.reason


def test_a_dead_worker_is_an_error_reply_and_is_replaced(grid: ProcessGrid) -> None:
    a, b, _ = grid.get_node_ids()
    before = {w.proc.pid for w in grid.workers}
    replies = grid.send_and_receive([_msg(a, "die"), _msg(b)], timeout=30)
    dead = [r for r in replies if r.has_error()]
    assert len(replies) == 2 and len(dead) == 1
    assert "exit code 7" in dead[0].error.reason and str(a) in dead[0].error.reason
    assert len({w.proc.pid for w in grid.workers} - before) == 1
    assert all(w.proc.is_alive() for w in grid.workers)
    assert _reply(grid.send_and_receive([_msg(a)], timeout=30)[0])["calls"] == 1


def test_past_the_timeout_the_message_goes_unanswered_and_the_worker_is_replaced(
    grid: ProcessGrid,
) -> None:
    a, b, _ = grid.get_node_ids()
    t0 = time.monotonic()
    replies = grid.send_and_receive([_msg(a, "sleep"), _msg(b)], timeout=2)
    assert time.monotonic() - t0 < 10
    assert [r.metadata.src_node_id for r in replies] == [b]
    assert all(w.proc.is_alive() for w in grid.workers)
    assert len(grid.send_and_receive([_msg(a), _msg(b)], timeout=30)) == 2


def test_workers_ignore_sigint_and_stop_on_close(grid: ProcessGrid) -> None:
    a, b, _ = grid.get_node_ids()
    replies = grid.send_and_receive([_msg(a, "sigint"), _msg(b)], timeout=30)
    assert len(replies) == 2 and not any(r.has_error() for r in replies)
    procs = [w.proc for w in grid.workers]
    grid.close()
    assert not any(p.is_alive() for p in procs)


def test_a_worker_dies_with_its_run(task_identity: None, tmp_path: Any) -> None:
    """A run killed with SIGKILL leaves no worker behind (PR_SET_PDEATHSIG)."""
    read, write = os.pipe()
    run = os.fork()
    if run == 0:  # the "run": forks its workers, reports their pids, waits to be killed
        try:
            os.close(read)
            grid = ProcessGrid(_app, num_nodes=2, num_procs=2)
            os.write(write, ",".join(str(w.proc.pid) for w in grid.workers).encode())
            time.sleep(60)
        finally:
            os._exit(0)
    os.close(write)
    pids = [int(p) for p in os.read(read, 100).decode().split(",")]
    os.kill(run, signal.SIGKILL)
    os.waitpid(run, 0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie reparented to init is gone in all but name
        return f.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.parametrize(("nodes", "procs"), [(0, 1), (1, 0)])
def test_bad_sizes_are_refused(nodes: int, procs: int) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        ProcessGrid(_app, num_nodes=nodes, num_procs=procs)
