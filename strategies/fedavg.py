"""DP FedAvg with secure aggregation: every client of the round's cohort trains, the aggregator
reveals only the sum of their updates, the server steps with their mean (third paper, Alg. 1,
server side).

Each round's cohort (every client, or a Poisson / fixed-size sample,
:mod:`fedpriv.mechanisms.client_sampling`) trains on worker nodes that host many virtual
clients (:mod:`fedpriv.run.engine`). The mean divides by the public expected cohort size
(``num_clients`` when all train), never by client-reported weights, nor by the number of
clients that survived a round (dropouts, non-finite updates), so neither a client's claim
about itself nor who dropped out can change the sensitivity. The round loop is the base's
(:class:`fedpriv.run.strategy.Strategy`); this strategy is its ``aggregate_train``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from fedpriv.common.errors import check
from fedpriv.common.validate import parse_enum
from fedpriv.run.job import ServerJob, State
from fedpriv.run.strategy import Strategy


class ServerOptimizer(StrEnum):
    """The server's step on the private mean Δ̄ (post-processing of the release)."""

    FEDAVG = "fedavg"  # w ← w + η Δ̄
    FEDAVGM = "fedavgm"  # v ← β₁ v + Δ̄; w ← w + η v
    FEDADAM = "fedadam"  # m ← β₁ m + (1−β₁) Δ̄; v ← β₂ v + (1−β₂) Δ̄²; w ← w + η m / (√v + τ)


@dataclass
class DPFedAvg(Strategy):
    """Synchronous DP FedAvg over a secure aggregator.

    Parameters
    ----------
    server_lr : float
        Server step size η_s: ``w ← w + η_s · (Σ_i Δ_i) / num_clients`` (FedAvg), > 0.
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
    pull_interval : float
        Seconds between the in-memory grid's reply polls, in (0, 1].

    Raises
    ------
    ConfigError
        For a value out of range (one line naming ``strategy.<field>``).
    """

    server_lr: float = 1.0
    server_optimizer: ServerOptimizer = ServerOptimizer.FEDAVG
    server_momentum: float = 0.9
    server_beta2: float = 0.99
    server_tau: float = 1e-3
    _moments: dict[str, dict[str, np.ndarray]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.server_lr > 0, "strategy.server_lr", self.server_lr, "must be > 0")
        self.server_optimizer = parse_enum(
            ServerOptimizer, "strategy.server_optimizer", self.server_optimizer
        )
        for name, v in (
            ("server_momentum", self.server_momentum),
            ("server_beta2", self.server_beta2),
        ):
            check(0 <= v < 1, f"strategy.{name}", v, "must be in [0, 1)")
        check(self.server_tau > 0, "strategy.server_tau", self.server_tau, "must be > 0")

    def aggregate_train(
        self, server_round: int, state: State, total: State, job: ServerJob
    ) -> tuple[State, dict[str, float]]:
        """``w + η_s step(Σ Δ / divisor)``; the divisor is public: the expected cohort size
        (``job.mean_divisor``), also when fewer clients contributed."""
        return self.apply(state, total, job.mean_divisor), {}

    def apply(self, state: State, total: State, divisor: float) -> State:
        """``w + η_s · step(Σ Δ / divisor)`` for the keys in ``total``; other entries unchanged."""
        new = dict(state)
        for key, value in total.items():
            step = self._step(key, np.asarray(value, dtype=np.float64) / divisor)
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

    def checkpoint_state(self) -> State:
        """The server optimizer's moments as flat arrays (``"m/<param>"``, ``"v/<param>"``)."""
        return {
            f"{name}/{key}": np.asarray(arr)
            for name, moments in self._moments.items()
            for key, arr in moments.items()
        }

    def restore_checkpoint_state(self, arrays: State) -> None:
        """Inverse of :meth:`checkpoint_state`."""
        self._moments = {}
        for flat, arr in arrays.items():
            name, _, key = flat.partition("/")
            self._moments.setdefault(name, {})[key] = np.array(arr)
