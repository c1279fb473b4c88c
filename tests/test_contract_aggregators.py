"""Every aggregator, through :class:`tests.contracts.AggregatorContract`.

One small Flower simulation (Ray backend, 3 probe clients whose integer updates are a known
function of (seed, partition, round), as in tests/test_secaggplus.py) runs one round through
Flower's real SecAgg+ and one through the ideal aggregator on the same grid; each member's
sum is compared with the sum computed here with numpy, so both give the same sum.
"""

from __future__ import annotations

import json
import math
from typing import Any, ClassVar

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.common.serde import recorddict_to_proto
from flwr.serverapp import Grid

from clients.secagg_probe import probe_update
from fedpriv.common.wire import CLIENTS_KEY, CONFIG_KEY, METRICS_KEY, UPDATE_KEY
from fedpriv.run.aggregation import (
    CLIENT_ERROR,
    NON_FINITE,
    AggregateResult,
    IdealAggregator,
    RoundFailed,
)
from fedpriv.run.engine import (
    WorkerReply,
    asks_sum,
    named_clients,
    node_messages,
    worker_messages,
)
from fedpriv.run.secagg_codec import flatten_update
from strategies.secaggplus import SecAggPlusAggregator
from tests.contracts import AggregatorContract, parse_reply, serialize_reply
from tests.probe_simulation import run_probe_simulation

N, BITS, SEED, ROUND = 3, 32, 77, 1
SHAPES = {"w": [4, 3], "b": [5]}


def _messages(nodes: list[int]) -> list[Message]:
    cfg = ConfigRecord(
        {"seed": SEED, "server_round": ROUND, "bits": BITS, "shapes": json.dumps(SHAPES)}
    )
    return [
        Message(
            RecordDict({"config": cfg}),
            dst_node_id=nid,
            message_type=MessageType.TRAIN,
            group_id=str(ROUND),
        )
        for nid in nodes
    ]


AGGREGATORS = {
    "secaggplus": lambda: SecAggPlusAggregator(
        num_shares=1.0, reconstruction_threshold=2, bits=BITS, stage_timeout=30.0
    ),
    "ideal": lambda: IdealAggregator(),
}


@pytest.fixture(scope="module")
def one_round() -> dict[Any, Any]:
    """``{aggregator name: AggregateResult or RoundFailed}`` of one round of one simulation."""

    def body(grid: Grid, nodes: list[int], out: dict[Any, Any]) -> None:
        for name, make in AGGREGATORS.items():
            try:
                out[name] = make().sum_updates(
                    grid, _messages(nodes), server_round=ROUND, timeout=30.0
                )
            except RoundFailed as exc:
                out[name] = exc

    return run_probe_simulation(N, body)


class _FakeGrid:
    """Answers every message with a prepared reply (the ideal aggregator needs no Flower run)."""

    def __init__(self, replies: list[Any]) -> None:
        self.replies = replies

    def send_and_receive(self, messages: list[Any], timeout: float) -> list[Any]:
        return self.replies


def _float_reply(update: dict[str, np.ndarray]) -> Any:
    """A successful reply carrying ``update`` (float arrays), through the real serde."""
    import torch

    reply = parse_reply(serialize_reply({k: torch.from_numpy(v) for k, v in update.items()}, {}))
    reply.has_error = lambda: False
    return reply


class _Contract(AggregatorContract):
    name: ClassVar[str]

    def result(self, one_round: dict[str, Any]) -> AggregateResult:
        res = one_round[self.name]
        assert not isinstance(res, RoundFailed), res
        return res

    @pytest.mark.slow
    def test_sum_equals_the_sum_of_the_updates(self, one_round: dict[str, Any]) -> None:
        """Exact integer sum of the clients' residues (no modular reduction), int64."""
        res = self.result(one_round)
        ups = [probe_update(SEED, p, ROUND, SHAPES, BITS) for p in range(N)]
        assert res.num_clients == N
        for key, shape in SHAPES.items():
            assert res.total[key].dtype == np.int64 and res.total[key].shape == tuple(shape)
            np.testing.assert_array_equal(res.total[key], np.sum([u[key] for u in ups], axis=0))

    @pytest.mark.slow
    def test_same_sum_as_every_other_aggregator(self, one_round: dict[str, Any]) -> None:
        mine = self.result(one_round)
        for other in AGGREGATORS:
            theirs = one_round[other]
            assert not isinstance(theirs, RoundFailed), (other, theirs)
            assert mine.num_clients == theirs.num_clients
            for key in SHAPES:
                np.testing.assert_array_equal(mine.total[key], theirs.total[key])


class TestIdealAggregator(_Contract):
    name = "ideal"
    aggregator_class = IdealAggregator

    @pytest.mark.usefixtures("task_identity")
    @pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
    def test_non_finite_update_is_never_summed(self, bad: float) -> None:
        """Issue 11 item 4: a non-finite update is never summed; that client counts as dropped
        for the round (the run then accounts it with the survivors' noise, or fails it), and
        ``min_replies`` counts finite updates only."""
        good = {"w": np.ones((2, 2), dtype=np.float32)}
        poisoned = {"w": np.array([[1.0, bad], [0.0, 0.0]], dtype=np.float32)}
        replies = [_float_reply(good), _float_reply(poisoned), _float_reply(good)]
        grid: Any = _FakeGrid(replies)
        msgs = node_messages([1, 2, 3], {"w": np.zeros((2, 2))}, 1)
        for agg in (IdealAggregator(), IdealAggregator(min_replies=2)):
            res = agg.sum_updates(grid, msgs, server_round=1, timeout=1.0)
            assert res.num_clients == 2
            assert res.dropped == {NON_FINITE: 1}
            assert all(np.isfinite(v).all() for v in res.total.values()), res.total
            np.testing.assert_array_equal(res.total["w"], 2 * good["w"])
        with pytest.raises(RoundFailed):
            IdealAggregator(min_replies=3).sum_updates(grid, msgs, server_round=1, timeout=1.0)

    @pytest.mark.usefixtures("task_identity")
    @pytest.mark.parametrize("summed", [False, True])
    @pytest.mark.parametrize("bad", [math.nan, math.inf])
    def test_worker_rows_are_clients(self, bad: float, summed: bool) -> None:
        """A worker's reply counts client by client, stacked or summed on the worker (issue 27
        item 3): a non-finite row is one dropped client, a failed client is one missing reply,
        and each reply sums its clients in id order, so here (one finite client in the second
        reply) the sum equals that of the same updates sent one node per client, bit for
        bit."""
        rng = np.random.default_rng(5)
        ups = {c: {"w": rng.normal(size=(2, 3)).astype(np.float32)} for c in range(6)}
        ups[4]["w"][1, 2] = bad
        workers = [[0, 1, 2], [3, 4, 5]]
        msgs = worker_messages(
            [7, 8], [c for w in workers for c in w], {"w": np.zeros((2, 3))}, 1, summed=summed
        )
        assert [named_clients(m) for m in msgs] == workers
        assert [asks_sum(m) for m in msgs] == [summed, summed]
        reply = _summed_reply if summed else _stacked_reply
        stacked = [
            reply(m, {c: ups[c] for c in w if c != 5}, {5: "boom"}) for m, w in zip(msgs, workers)
        ]
        res = IdealAggregator(min_replies=4).sum_updates(
            _FakeGrid(stacked), msgs, server_round=1, timeout=1.0
        )
        assert res.num_clients == 4 and res.dropped == {NON_FINITE: 1, CLIENT_ERROR: 2}
        assert res.errors == ["boom", "boom"]  # client 5 of each worker raised
        assert res.metrics == {"noise_draws": 4.0}  # the finite clients' metrics only
        single = [_float_reply(ups[c]) for c in (0, 1, 2, 3)]
        one = IdealAggregator().sum_updates(
            _FakeGrid(single),
            node_messages([1, 2, 3, 4], {"w": np.zeros((2, 3))}, 1),
            server_round=1,
            timeout=1.0,
        )
        np.testing.assert_array_equal(res.total["w"], one.total["w"])
        with pytest.raises(RoundFailed, match="5/6 clients replied"):
            IdealAggregator().sum_updates(_FakeGrid(stacked), msgs, server_round=1, timeout=1.0)

    @pytest.mark.usefixtures("task_identity")
    def test_summed_reply_weighs_one_update(self) -> None:
        """Issue 27 item 3: a summed worker reply carries one float64 row whatever the number
        of clients; the stacked reply of the same clients grows with them."""
        rng = np.random.default_rng(2)
        ups = {c: {"w": rng.normal(size=(50, 50)).astype(np.float32)} for c in range(40)}
        msg = worker_messages([7], list(ups), {"w": np.zeros((50, 50))}, 1, summed=True)[0]
        size = {
            summed: len(recorddict_to_proto(make(msg, ups, {}).content).SerializeToString())
            for summed, make in ((False, _stacked_reply), (True, _summed_reply))
        }
        assert 50 * 50 * 8 < size[True] < 50 * 50 * 8 + 2000  # one float64 row, plus ids
        assert size[False] > 40 * 50 * 50 * 4


def _summed_reply(msg: Any, ups: dict[int, dict[str, np.ndarray]], failed: dict[int, str]) -> Any:
    """A worker's summed reply to ``msg`` (rows of ``ups`` in id order), through the serde."""
    out = WorkerReply(summed=True)
    for c in sorted(ups):
        out.add([c], {k: v[None] for k, v in ups[c].items()}, [{"noise_draws": 1.0}])
    content = out.reply(msg, failed).content
    reply = parse_reply(recorddict_to_proto(content).SerializeToString())
    reply.has_error = lambda: False
    return reply


def _stacked_reply(msg: Any, ups: dict[int, dict[str, np.ndarray]], failed: dict[int, str]) -> Any:
    """A worker's successful reply (rows of ``ups`` in id order), through the real serde."""
    from flwr.app import Array, MetricRecord

    ids = sorted(ups)
    content = RecordDict(
        {
            UPDATE_KEY: ArrayRecord({"w": Array(np.stack([ups[c]["w"] for c in ids]))}),
            METRICS_KEY: MetricRecord({"noise_draws": [1.0] * len(ids)}),
            CONFIG_KEY: ConfigRecord(
                {CLIENTS_KEY: ids, "failed": list(failed), "errors": list(failed.values())}
            ),
        }
    )
    reply = parse_reply(recorddict_to_proto(content).SerializeToString())
    reply.has_error = lambda: False
    return reply


class TestSecAggPlusAggregator(_Contract):
    name = "secaggplus"
    aggregator_class = SecAggPlusAggregator

    @pytest.mark.parametrize("bad", [math.nan, math.inf])
    def test_non_finite_update_is_never_summed(self, bad: float) -> None:
        """SecAgg+ takes integer residues only: a float update (finite or not) is refused
        by the client-side mod before anything is masked or sent."""
        with pytest.raises(TypeError, match="integers only"):
            flatten_update(ArrayRecord([np.array([1.0, bad])]), BITS)
