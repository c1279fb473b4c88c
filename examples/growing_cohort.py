"""A strategy written only against fedpriv's ``Strategy`` base: DP-FedAvg whose cohort grows
round by round, accounted as it runs.

Round r trains the first ``min(N, initial_clients + growth * (r - 1))`` clients of the round's
cohort. The base's loop does everything else (nodes, resume, budget, failures, evaluation,
rows, checkpoints); the job accounts each round with the clients whose noise is in its sum, so
an early round with few clients costs more ε (local DP-SGD: σ √(m / N) for m of N clients):

    .venv/bin/fedpriv strategy=custom \\
        strategy._target_=examples.growing_cohort.GrowingCohortDPFedAvg \\
        +strategy.initial_clients=2 +strategy.growth=4
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flwr.app import Message

from fedpriv.common.errors import check
from fedpriv.run.job import ServerJob, State
from fedpriv.run.strategy import Strategy


@dataclass
class GrowingCohortDPFedAvg(Strategy):
    """DP-FedAvg over a cohort that grows by ``growth`` clients a round from ``initial_clients``.

    The mean divides the released sum by the round's cohort size, which depends on the round
    number only (public), never on who replied.
    """

    initial_clients: int = 2
    growth: int = 2
    server_lr: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, value in (("initial_clients", self.initial_clients), ("growth", self.growth)):
            check(isinstance(value, int) and value >= 1, f"strategy.{name}", value, "must be >= 1")

    def round_size(self, server_round: int, available: int) -> int:
        """Clients asked in ``server_round`` (at most the round's cohort)."""
        return min(available, self.initial_clients + self.growth * (server_round - 1))

    def configure_train(
        self,
        server_round: int,
        state: State,
        cohort: list[int],
        node_ids: list[int],
        job: ServerJob,
    ) -> list[Message]:
        size = self.round_size(server_round, len(cohort))
        return job.messages_for(node_ids, cohort[:size], state, server_round)

    def aggregate_train(
        self, server_round: int, state: State, total: State, job: ServerJob
    ) -> tuple[State, dict[str, float]]:
        size = job.cohort_size  # the clients asked this round: public, whoever replied
        new = dict(state)
        for key, value in total.items():
            step = np.asarray(value, dtype=np.float64) * (self.server_lr / size)
            new[key] = (state[key] + step).astype(state[key].dtype)
        return new, {"cohort_grown_to": float(size)}
