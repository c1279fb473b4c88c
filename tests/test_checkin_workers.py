"""Random check-ins on worker nodes: the layout changes nothing a run computes.

For the same seed, ``num_workers=2`` (many virtual clients per worker) and one client per
worker (``num_workers=num_clients``) give the same check-ins (each client's own draw, the
same as the node-per-client code: :func:`fedpriv.mechanisms.checkin_draw.checkin_rng`), the
same per-slot updates, the same final model and the same ε, for every variant. The per-slot
updates are summed in check-in (ticket) order whatever the layout, so the comparison is
BITWISE.

The in-process grid below runs the real strategy (on a real :class:`fedpriv.run.job.ServerJob`)
and the real client handlers (``message_handler(QUERY)`` and ``message_handler(TRAIN)``: the
check-in query and the slot messages) with one Flower ``Context`` per node, the way Flower's
simulation does, without Ray; the slow test compares a Flower run (Ray) with the
in-process run of the other layout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Context, Error, Message, MessageType, RecordDict

from fedpriv.common.wire import ABSTAIN
from fedpriv.mechanisms.checkin_draw import checkin_rng, checkin_window, draw_checkin
from fedpriv.report.display import RoundDisplay
from fedpriv.report.results import RunRecorder
from fedpriv.run.aggregation import IdealAggregator
from fedpriv.run.algorithm import ClientAlgorithm, MessageHandler, MessageKind
from fedpriv.run.client_app import worker_algorithm
from fedpriv.run.config import compose_config
from fedpriv.run.job import ServerJob
from fedpriv.run.plan import RunPlan
from fedpriv.run.prepare import prepare, run_layout
from fedpriv.run.round_log import RoundLog
from fedpriv.run.run_privacy import RunPrivacy
from fedpriv.run.runner import run_experiment
from strategies.checkin_server import CheckinStrategy, PassProtocol, SlotTask

BASE = ["client=checkin", "privacy=checkin", "strategy=checkin", "model=logistic"]
N = 20
VARIANTS = {
    "fixed": ["client.num_slots=10", "privacy.checkin_probability=0.8"],
    "averaged": ["client.num_slots=10"],
    "sliding-window": ["client.num_slots=5"],
    "poisson": ["client.num_slots=10"],
}


def _cfg(overrides: list[str]) -> Any:
    return compose_config([*BASE, *overrides])


def _overrides(variant: str, workers: int) -> list[str]:
    return [
        f"num_clients={N}",
        "num_rounds=2",
        f"client.variant={variant}",
        *VARIANTS[variant],
        "strategy.batch_size=3",
        f"num_workers={workers}",
        "client_resources.num_cpus=0.1",  # room for 20 actors on the 2 CPUs
        "ray_init_args.num_cpus=2",
        "progress=false",
        "plot=false",
    ]


class InProcessGrid:
    """Flower's grid for ``num_nodes`` nodes, in this process: a message goes to the
    algorithm's handler of its kind (as the client app routes it) with its node's own
    ``Context`` (kept between messages); a handler that raises answers with an error reply.
    Node ids are large random-looking 64-bit integers, as Flower's."""

    def __init__(self, plan: RunPlan, num_nodes: int) -> None:
        self.plan = plan
        self.algorithm: Any = worker_algorithm(plan.to_payload())
        self.ids = [(2**63 + 7_919 * (i + 1) * 1_000_003) % 2**64 for i in range(num_nodes)]
        self.contexts = {
            nid: Context(
                run_id=1,
                node_id=nid,
                node_config={"partition-id": i, "num-partitions": num_nodes},
                state=RecordDict(),
                run_config={},
            )
            for i, nid in enumerate(self.ids)
        }
        self.sends: list[int] = []

    def get_node_ids(self) -> list[int]:
        return list(self.ids)

    def send_and_receive(self, messages: list[Message], timeout: float | None = None) -> list:
        self.sends.append(len(messages))
        out = []
        for msg in messages:
            ctx = self.contexts[msg.metadata.dst_node_id]
            query = msg.metadata.message_type == MessageType.QUERY
            handler = self.algorithm.message_handler(
                MessageKind.QUERY if query else MessageKind.TRAIN
            )
            try:
                out.append(handler(self.plan, msg, ctx))
            except Exception as exc:
                out.append(Message(Error(code=0, reason=str(exc)), reply_to=msg))
        return out


class Recording(CheckinStrategy):
    """The check-in strategy, recording each pass's check-ins and each slot's update."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.checkins: list[tuple[dict[int, int], dict[int, int]]] = []
        self.slot_updates: list[dict[tuple[int, int], dict[str, np.ndarray]]] = []

    def check_in(self, *args: Any, **kw: Any) -> tuple[dict[int, int], dict[int, int], int]:
        answers, tickets, missing = super().check_in(*args, **kw)
        self.checkins.append((answers, tickets))
        return answers, tickets, missing

    def ask(self, grid: Any, chunk: Any, state: Any, server_round: int, *a: Any, **k: Any):
        rows = super().ask(grid, chunk, state, server_round, *a, **k)
        self.slot_updates.append({(server_round, *key): v for key, v in rows.items()})
        return rows


def in_process_job(plan: RunPlan, algorithm: ClientAlgorithm, out_dir: Path) -> ServerJob:
    """The run's :class:`ServerJob` as the runner builds it (no checkpoints: the check-in
    strategy is not resumable), recording into ``out_dir``."""
    privacy = RunPrivacy(plan.privacy, plan.cohort.nominal_size)
    display = RoundDisplay(plan.num_rounds, enabled=False)
    log = RoundLog(privacy, RunRecorder(out_dir, privacy={}), display, None, plan.secure_mode)
    return ServerJob(plan, algorithm, IdealAggregator(), run_layout(plan), log)


def recording_strategy(plan: RunPlan) -> Recording:
    """The plan's check-in strategy (its configured fields), recording."""
    return Recording(**{k: v for k, v in plan.strategy.items() if k != "_target_"})


def _run_in_process(tmp_path: Path, variant: str, workers: int) -> dict[str, Any]:
    plan, algorithm = prepare(_cfg(_overrides(variant, workers)))
    layout = run_layout(plan)
    assert layout.num_workers == workers and not layout.one_node_per_client
    job = in_process_job(plan, algorithm, tmp_path / f"{variant}-{workers}")
    recorder = job.log.recorder
    strategy = recording_strategy(plan)
    strategy.check_algorithm(algorithm)
    grid = InProcessGrid(plan, layout.num_workers)
    state = strategy.start(grid, job)
    return {
        "state": state,
        "epsilon": job.privacy.epsilon(),
        "rounds": recorder.rounds,
        "checkins": strategy.checkins,
        "slot_updates": strategy.slot_updates,
        "sends": grid.sends,
        "algorithm": algorithm,
    }


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_two_workers_and_one_client_per_worker_compute_the_same_run(
    tmp_path: Path, task_identity: None, variant: str
) -> None:
    two = _run_in_process(tmp_path, variant, 2)
    each = _run_in_process(tmp_path, variant, N)
    algo = two["algorithm"]
    # the same check-ins: each client's own draw with its own RNG, the node-per-client draw
    assert two["checkins"] == each["checkins"]
    for server_round, (answers, tickets) in enumerate(two["checkins"], start=1):
        assert sorted(answers) == list(range(N))  # every client answered
        for pid in range(N):
            rng = checkin_rng(0, server_round, pid, False)
            window = checkin_window(variant, algo.num_slots, pid)
            assert answers[pid] == draw_checkin(rng, algo.privacy.checkin_probability, window)
            assert tickets[pid] == int(rng.integers(2**62))
    assert (len(two["checkins"]) == 2) == (variant != "poisson")
    # the same per-slot updates, bitwise, in the same blocks
    assert [sorted(b) for b in two["slot_updates"]] == [sorted(b) for b in each["slot_updates"]]
    for b2, bn in zip(two["slot_updates"], each["slot_updates"], strict=True):
        for key, upd in b2.items():
            assert upd.keys() == bn[key].keys()
            for k in upd:
                assert np.array_equal(upd[k], bn[key][k]), (key, k)
    asked = sum(len(b) for b in two["slot_updates"])
    assert asked == sum(r["updates_used"] for r in two["rounds"]) > 0
    # the same final model (bitwise) and the same epsilon and slot figures
    for k in two["state"]:
        assert np.array_equal(two["state"][k], each["state"][k]), k
    assert two["epsilon"] == each["epsilon"]
    assert two["epsilon"] == pytest.approx(algo.privacy.pass_event().epsilon(1e-6, 2))
    keys = ("slots", "checkins", "updates_used", "dummies", "skipped", "accuracy", "epsilon")
    for r2, rn in zip(two["rounds"], each["rounds"], strict=True):
        assert {k: r2.get(k) for k in keys} == {k: rn.get(k) for k in keys}
    # 2 workers: at most 2 messages per send; one client per worker: up to b * clients per slot
    assert max(two["sends"]) <= 2 and max(each["sends"]) > 2


def test_answers_for_clients_a_worker_was_not_asked_about_are_ignored(
    task_identity: None,
) -> None:
    plan, _ = prepare(_cfg(_overrides("fixed", 2)))
    grid = InProcessGrid(plan, 2)
    real = grid.send_and_receive

    def lying(messages: list[Message], timeout: float | None = None) -> list:
        replies = real(messages, timeout)
        rec = replies[0].content.config_records["checkin"]  # worker 0 claims client 19 too
        rec["clients"], rec["slots"] = [*rec["clients"], 19], [*rec["slots"], 1]
        rec["tickets"] = [*rec["tickets"], 0]
        return replies

    grid.send_and_receive = lying  # type: ignore[method-assign]
    protocol = PassProtocol.of(plan.privacy)
    shares = [list(range(10)), list(range(10, 20))]
    answers, _, missing = CheckinStrategy().check_in(grid, grid.ids, shares, 1, protocol, 1.0)
    rng = checkin_rng(0, 1, 19, False)
    assert answers[19] == draw_checkin(rng, 0.8, (1, 10)) and missing == 0


def test_a_worker_that_fails_the_query_makes_its_clients_abstain(task_identity: None) -> None:
    plan, _ = prepare(_cfg(_overrides("fixed", 2)))
    grid = InProcessGrid(plan, 2)
    algo = grid.algorithm
    boom = grid.ids[1]

    class Failing:
        def message_handler(self, kind: MessageKind) -> MessageHandler | None:
            real = algo.message_handler(kind)
            if kind is not MessageKind.QUERY:
                return real

            def query(p: RunPlan, msg: Message, ctx: Context) -> Message:
                if msg.metadata.dst_node_id == boom:
                    raise RuntimeError("worker down")
                return real(p, msg, ctx)

            return query

    grid.algorithm = Failing()
    shares = [list(range(10)), list(range(10, 20))]
    protocol = PassProtocol.of(plan.privacy)
    answers, _, missing = CheckinStrategy().check_in(grid, grid.ids, shares, 1, protocol, 1.0)
    assert sorted(answers) == list(range(10)) and missing == 10
    # the server then asks only the clients that answered; an empty slot gets a dummy
    assert all(s == ABSTAIN or 1 <= s <= 10 for s in answers.values())
    assert SlotTask(1, ()).clients == ()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("variant", "workers"),
    [("fixed", 2), ("fixed", N), ("averaged", 2), ("sliding-window", 2), ("poisson", 2)],
)
def test_flower_run_agrees_with_the_other_layout(
    tmp_path: Path, task_identity: None, variant: str, workers: int
) -> None:
    """On Flower's simulation engine (Ray) with ``workers`` workers: the same final model
    (bitwise), ε and slot figures as the in-process run with the other layout."""
    summary = run_experiment(_cfg(_overrides(variant, workers)), tmp_path / "flower")
    assert summary["status"] == "complete"
    res = json.loads((tmp_path / "flower" / "results.json").read_text())
    model = dict(np.load(tmp_path / "flower" / "model.npz"))
    other = _run_in_process(tmp_path, variant, N if workers == 2 else 2)
    assert res["privacy"]["epsilon"] == other["epsilon"]
    keys = ("slots", "checkins", "updates_used", "dummies", "skipped", "accuracy", "epsilon")
    assert len(res["rounds"]) == len(other["rounds"]) == 2
    for r, o in zip(res["rounds"], other["rounds"], strict=True):
        assert {k: r.get(k) for k in keys} == {k: o.get(k) for k in keys}
    assert model.keys() == other["state"].keys()
    for k in model:
        assert np.array_equal(model[k], other["state"][k]), k


def test_checked_in_lookup_contiguous_and_not() -> None:
    from flwr.app import ConfigRecord

    from clients.checkin_clients import CheckinClient

    def ctx(clients: list[int], slots: list[int], server_round: int = 1) -> Context:
        state = RecordDict(
            {
                "checkin": ConfigRecord(
                    {"server_round": server_round, "clients": clients, "slots": slots}
                )
            }
        )
        return Context(run_id=1, node_id=1, node_config={}, state=state, run_config={})

    look = CheckinClient._checked_in
    assert look(ctx([10, 11, 12], [3, -1, 7]), 1, [12, 10, 13, 9]) == [7, 3, None, None]
    assert look(ctx([5, 1, 9], [2, 4, 6]), 1, [9, 1, 5, 7]) == [6, 4, 2, None]
    assert look(ctx([5, 1, 9], [2, 4, 6], server_round=2), 1, [9]) == [None]  # another pass
    empty = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    assert look(empty, 1, [0]) == [None]
