"""Bounded-staleness FedAvg: clients get models at most max_staleness rounds old, drawn
reproducibly; the server applies the updates to its current model."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fedpriv.common.errors import ConfigError
from fedpriv.run.aggregation import AggregateResult
from fedpriv.run.engine import node_messages
from fedpriv.run.strategy import Released
from strategies.async_fedavg import AsyncDPFedAvg

pytestmark = pytest.mark.usefixtures("task_identity")


class FakeGrid:
    def get_node_ids(self) -> list[int]:
        return [11, 12, 13]


class EchoAggregator:
    """Each client's update is (its model's w) + 1, so the sum reveals which models were sent."""

    def __init__(self) -> None:
        self.sent: list[list[float]] = []

    def sum_updates(
        self, grid: Any, messages: list, *, server_round: int, timeout: float
    ) -> AggregateResult:
        ws = [float(m.content.array_records["arrays"].to_numpy_ndarrays()[0][0]) for m in messages]
        self.sent.append(ws)
        return AggregateResult(
            total={"w": np.array([sum(w + 1.0 for w in ws)])}, num_clients=len(ws), metrics={}
        )


class FakeJob:
    """The parts of :class:`fedpriv.run.job.ServerJob` the strategy base's loop uses."""

    num_clients, num_nodes, num_rounds, round_timeout, mean_divisor = 3, 3, 6, 5.0, 3.0
    first_round = 1

    def __init__(self) -> None:
        self.aggregator = EchoAggregator()
        self.released: list[tuple[int, float, dict]] = []
        self.admitted = 0

    def connect(self, grid: Any, pull_interval: float) -> list[int]:
        return sorted(grid.get_node_ids())

    def initial_state(self) -> dict[str, np.ndarray]:
        return {"w": np.array([0.0])}

    def draw_cohort(self, server_round: int) -> list[int]:
        return [0, 1, 2]

    def messages_for(self, node_ids: list, clients: list, state: dict, server_round: int) -> list:
        return node_messages([node_ids[c] for c in clients], state, server_round)

    def sum_updates(self, grid: Any, messages: list, server_round: int) -> AggregateResult:
        result = self.aggregator.sum_updates(
            grid, messages, server_round=server_round, timeout=self.round_timeout
        )
        self.admit(result, server_round)
        return result

    def round_empty(self, server_round: int) -> None:
        raise AssertionError("every cohort holds all clients")

    def decode_sum(self, total: dict, server_round: int) -> dict:
        return total

    def evaluate_state(self, state: dict) -> tuple[float, float]:
        return 0.0, 0.0

    def may_start_round(self, server_round: int) -> bool:
        return True

    def admit(self, result: AggregateResult, server_round: int) -> None:
        self.admitted += 1

    def round_released(
        self, server_round: int, released: Released, metrics: dict, seconds: float
    ) -> None:
        self.released.append((server_round, float(released.state["w"][0]), released.figures))

    def round_failed(self, *args: Any) -> None:
        raise AssertionError("no round should fail")


def _run(max_staleness: int, seed: int = 0) -> tuple[FakeJob, list[float]]:
    job = FakeJob()
    strategy = AsyncDPFedAvg(max_staleness=max_staleness, seed=seed)
    strategy.start(FakeGrid(), job)  # type: ignore[arg-type]
    return job, [w for _, w, _ in job.released]


def test_synchronous_when_staleness_zero() -> None:
    job, states = _run(0)
    # every client gets the current w; w <- w + mean(w + 1) = 2 w + 1 each round
    assert states == [1.0, 3.0, 7.0, 15.0, 31.0, 63.0]
    assert all(len(set(ws)) == 1 for ws in job.aggregator.sent)
    assert job.admitted == 6  # every sum is checked as accountable before it is applied


def test_stale_models_within_bound_and_applied_to_current() -> None:
    job, states = _run(2, seed=3)
    history = [0.0, *states]
    for r, ws in enumerate(job.aggregator.sent, start=1):
        allowed = history[max(0, r - 1 - 2) : r]  # models released at most 2 rounds before round r
        assert all(w in allowed for w in ws), (r, ws, allowed)
        # the server adds the mean of the updates to its CURRENT model
        assert history[r] == pytest.approx(history[r - 1] + np.mean([w + 1 for w in ws]))
    assert any(w != history[r - 1] for r, ws in enumerate(job.aggregator.sent, start=1) for w in ws)
    assert [e["mean_staleness"] for _, _, e in job.released][0] == 0.0  # nothing older exists yet
    job2, states2 = _run(2, seed=3)
    assert states2 == states  # reproducible from the seed


def test_staleness_draws_are_uniform() -> None:
    strategy = AsyncDPFedAvg(max_staleness=3, seed=1)
    draws = np.array([strategy.staleness(r, i, 10) for r in range(1, 201) for i in range(20)])
    counts = np.bincount(draws, minlength=4)
    assert counts.sum() == 4000 and counts.min() > 4000 / 4 * 0.85  # ~1000 each; 5 sigma is ~14%


def test_bad_staleness() -> None:
    with pytest.raises(ConfigError, match="strategy.max_staleness=-1 must be an integer >= 0"):
        AsyncDPFedAvg(max_staleness=-1)


# ------------------------------------------------------------------ issue 11, item 1
def test_update_divided_by_public_num_clients_never_by_replies() -> None:
    # a dropout (2 of 3 contributed) and client-reported metrics change nothing in the divisor:
    # w <- w + lr * sum / num_clients (the configured, public count: job.mean_divisor = 3)
    state = {"w": np.array([1.0, -2.0])}
    for metrics in ({}, {"examples": 1e6, "local_rounds": 99.0, "noise_draws": 7.0}):
        strategy = AsyncDPFedAvg(server_lr=0.5, max_staleness=2)
        job = FakeJob()
        job.initial_state = lambda: dict(state)  # type: ignore[method-assign]
        strategy.initial_state(job)  # type: ignore[arg-type]
        strategy.configure_train(3, state, [0, 1, 2], [11, 12, 13], job)  # type: ignore[arg-type]
        result = AggregateResult(total={"w": np.array([3.0, 6.0])}, num_clients=2, metrics=metrics)
        new, _ = strategy.aggregate_train(3, state, result.total, job)  # type: ignore[arg-type]
        np.testing.assert_allclose(new["w"], [1.0 + 0.5 * 1.0, -2.0 + 0.5 * 2.0], rtol=1e-15)
        # the public divisor is the job's, whatever the result says about its contributors
        direct = strategy.apply(state, result.total, FakeJob.mean_divisor)
        np.testing.assert_allclose(direct["w"], new["w"], rtol=0)


class ScaledEchoAggregator(EchoAggregator):
    """Like EchoAggregator, but the clients' updates (their data) are scaled by ``factor``."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def sum_updates(
        self, grid: Any, messages: list, *, server_round: int, timeout: float
    ) -> AggregateResult:
        out = super().sum_updates(grid, messages, server_round=server_round, timeout=timeout)
        out.total = {k: v * self.factor for k, v in out.total.items()}
        return out


def test_staleness_does_not_depend_on_the_clients_updates() -> None:
    # the ages drawn (hence which public model each client computes on, and the equal weight
    # 1/num_clients of every update) are a function of (seed, round, client index) only
    ages = []
    for factor in (1.0, -3.0, 1e3):
        job = FakeJob()
        job.aggregator = ScaledEchoAggregator(factor)
        AsyncDPFedAvg(max_staleness=3, seed=5).start(FakeGrid(), job)  # type: ignore[arg-type]
        ages.append([e["mean_staleness"] for _, _, e in job.released])
    assert ages[0] == ages[1] == ages[2] and any(a > 0 for a in ages[0])
