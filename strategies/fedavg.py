"""DP FedAvg with secure aggregation: every client trains each round, the aggregator reveals
only the sum of their updates, the server adds its mean (third paper, Alg. 1, server side).

Each round's cohort (every client, or a Poisson / fixed-size sample, :mod:`fedpriv.mechanisms.client_sampling`)
trains on worker nodes that host many virtual clients (:mod:`fedpriv.run.engine`). The mean
divides by the public expected cohort size (``num_clients`` when all train) — never by
client-reported weights, nor by the number of clients that survived a round (dropouts,
non-finite updates) — so neither a client's claim about itself nor who dropped out can change
the sensitivity.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, Protocol

import numpy as np
from flwr.app import Message
from flwr.serverapp import Grid

from fedpriv.run.aggregation import AggregateResult, Aggregator, RoundFailed
from fedpriv.run.engine import check_pull_interval


class ServerJob(Protocol):
    """What a strategy needs from the run (implemented by :class:`fedpriv.run.runner.Job`)."""

    num_clients: int
    num_nodes: int
    num_rounds: int
    round_timeout: float
    aggregator: Aggregator
    mean_divisor: float

    def initial_state(self) -> dict[str, np.ndarray]: ...
    def draw_cohort(self, server_round: int) -> list[int]: ...
    def messages_for(
        self,
        node_ids: list[int],
        clients: list[int],
        state: dict[str, np.ndarray],
        server_round: int,
    ) -> list[Message]: ...
    def round_empty(self, server_round: int) -> None: ...
    def decode_sum(
        self, total: dict[str, np.ndarray], server_round: int
    ) -> dict[str, np.ndarray]: ...
    def may_start_round(self, server_round: int) -> bool: ...
    def admit(self, result: AggregateResult, server_round: int) -> None: ...
    def round_released(
        self,
        server_round: int,
        state: dict[str, np.ndarray],
        result: AggregateResult,
        seconds: float,
        extra: dict | None = None,
        contributors: int | None = None,
    ) -> None: ...
    def round_failed(self, server_round: int, error: RoundFailed, seconds: float) -> None: ...


def wait_for_nodes(grid: Grid, num_nodes: int, timeout: float) -> list[int]:
    """Node ids once ``num_nodes`` are registered (sorted Python ints); raises after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        ids = sorted(int(i) for i in grid.get_node_ids())
        if len(ids) >= num_nodes:
            return ids[:num_nodes]
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"only {len(ids)} of {num_nodes} Flower nodes registered after {timeout:.0f} s"
            )
        time.sleep(0.05)


class ServerOptimizer(StrEnum):
    """The server's step on the private mean Δ̄ (post-processing of the release)."""

    FEDAVG = "fedavg"  # w ← w + η Δ̄
    FEDAVGM = "fedavgm"  # v ← β₁ v + Δ̄; w ← w + η v
    FEDADAM = "fedadam"  # m ← β₁ m + (1−β₁) Δ̄; v ← β₂ v + (1−β₂) Δ̄²; w ← w + η m / (√v + τ)


@dataclass
class DPFedAvg:
    """Synchronous DP FedAvg over a secure aggregator.

    Parameters
    ----------
    server_lr : float
        Server step size η_s: ``w ← w + η_s · (Σ_i Δ_i) / num_clients`` (FedAvg).
    pull_interval : float
        Seconds between the in-memory grid's reply polls (Flower's default 0.1 s adds up to
        0.1 s to every round), in (0, 1].
    server_optimizer : {"fedavg", "fedavgm", "fedadam"}
        The server's step on the mean (Hsu, Qi, Brown 2019, "Measuring the Effects of
        Non-Identical Data Distribution for Federated Visual Classification",
        arXiv:1909.06335, FedAvgM; Reddi et al. 2021, "Adaptive Federated Optimization",
        arXiv:2003.00295, Alg. 2, FedAdam).
    server_momentum : float
        β₁ in [0, 1) (FedAvgM, FedAdam).
    server_beta2 : float
        β₂ in [0, 1) (FedAdam).
    server_tau : float
        τ > 0, FedAdam's adaptivity (Reddi et al. use 1e-3).

    Raises
    ------
    ConfigError
        For a value out of range (one line naming ``strategy.<field>``).
    """

    server_lr: float = 1.0
    pull_interval: float = 0.01
    server_optimizer: str = "fedavg"
    server_momentum: float = 0.9
    server_beta2: float = 0.99
    server_tau: float = 1e-3
    #: Sends worker messages (many virtual clients per Flower node, sampled cohorts).
    virtual_clients: ClassVar[bool] = True
    #: Writes checkpoints (:meth:`checkpoint_state`) so that ``fedpriv resume=RUN_DIR`` works.
    resumable: ClassVar[bool] = True

    def __post_init__(self) -> None:
        from fedpriv.accounting.spec import parse_enum
        from fedpriv.common.errors import check

        check(self.server_lr > 0, "strategy.server_lr", self.server_lr, "must be > 0")
        check_pull_interval(self.pull_interval)
        self.server_optimizer = parse_enum(
            ServerOptimizer, "strategy.server_optimizer", self.server_optimizer
        )
        for name in ("server_momentum", "server_beta2"):
            v = getattr(self, name)
            check(0 <= v < 1, f"strategy.{name}", v, "must be in [0, 1)")
        check(self.server_tau > 0, "strategy.server_tau", self.server_tau, "must be > 0")
        self._moments: dict[str, dict[str, np.ndarray]] = {}

    def check_algorithm(self, algorithm: object) -> None:
        """Refuse, before training, a client algorithm that needs its own server (check-ins)."""
        if hasattr(algorithm, "query_handler"):
            from fedpriv.common.errors import ConfigError

            raise ConfigError("client", type(algorithm).__name__, "needs strategy=checkin")

    def checkpoint_state(self) -> dict[str, np.ndarray]:
        """The server optimizer's moments as flat arrays (``"m/<param>"``, ``"v/<param>"``)."""
        return {
            f"{name}/{key}": np.asarray(arr)
            for name, moments in self._moments.items()
            for key, arr in moments.items()
        }

    def restore_checkpoint_state(self, arrays: dict[str, np.ndarray]) -> None:
        """Inverse of :meth:`checkpoint_state`."""
        self._moments = {}
        for flat, arr in arrays.items():
            name, _, key = flat.partition("/")
            self._moments.setdefault(name, {})[key] = np.array(arr)

    def run(self, grid: Grid, job: ServerJob) -> dict[str, np.ndarray]:
        """The server's main loop from ``job.first_round`` (1, or the round after a resumed
        checkpoint); returns the final global state."""
        node_ids = wait_for_nodes(grid, job.num_nodes, job.round_timeout)
        if hasattr(grid, "pull_interval"):
            grid.pull_interval = self.pull_interval
        state = job.initial_state()
        for server_round in range(getattr(job, "first_round", 1), job.num_rounds + 1):
            if not job.may_start_round(server_round):
                break
            t0 = time.monotonic()
            cohort = job.draw_cohort(server_round)
            if not cohort:
                job.round_empty(server_round)
                continue
            try:
                result = job.aggregator.sum_updates(
                    grid,
                    job.messages_for(node_ids, cohort, state, server_round),
                    server_round=server_round,
                    timeout=job.round_timeout,
                )
                job.admit(result, server_round)  # a sum with dropouts must be accountable
            except RoundFailed as exc:
                job.round_failed(server_round, exc, time.monotonic() - t0)
                continue
            result.total = job.decode_sum(result.total, server_round)
            state = self.apply(state, result, job.mean_divisor)
            job.round_released(
                server_round, state, result, time.monotonic() - t0, contributors=result.num_clients
            )
        return state

    def apply(
        self, state: dict[str, np.ndarray], result: AggregateResult, divisor: float
    ) -> dict[str, np.ndarray]:
        """``w + η_s Σ Δ / divisor`` for the keys in the sum; other entries unchanged.

        ``divisor`` is public: the configured ``num_clients`` or the expected cohort size
        (``client_sample_rate · num_clients``, ``num_sampled_clients``), also when fewer
        contributed to ``result``.
        """
        new = dict(state)
        for key, total in result.total.items():
            step = self._step(key, np.asarray(total, dtype=np.float64) / divisor)
            new[key] = (state[key] + self.server_lr * step).astype(state[key].dtype)
        return new

    def _step(self, key: str, mean: np.ndarray) -> np.ndarray:
        """The server optimizer's direction for parameter ``key`` from the mean delta."""
        kind, b1 = self.server_optimizer, self.server_momentum
        if kind is ServerOptimizer.FEDAVG:
            return mean
        m = self._moments.setdefault("m", {})
        if kind is ServerOptimizer.FEDAVGM:
            m[key] = b1 * m.get(key, 0.0) + mean
            return m[key]
        v = self._moments.setdefault("v", {})
        m[key] = b1 * m.get(key, 0.0) + (1 - b1) * mean
        v[key] = self.server_beta2 * v.get(key, 0.0) + (1 - self.server_beta2) * mean**2
        return m[key] / (np.sqrt(v[key]) + self.server_tau)
