"""Bounded-staleness FedAvg: the first paper's asynchronous (interrupt) model, simulated.

In Algorithm 1 a client keeps computing on the last global model it received; a newer one
interrupts it only when it arrives, so an update may be computed on a model up to
``max_staleness`` server rounds old. This strategy simulates that reproducibly: in server
round ``r`` client ``i`` is sent the global model of ``tau`` releases ago, ``tau`` drawn
uniformly from ``{0, ..., min(max_staleness, r - 1)}`` by a generator seeded with
``(seed, r, i)`` (``i`` the client's id); the server applies the updates it receives to its
CURRENT model, as they come.

Privacy is unchanged: every global model is a post-processing of earlier releases (public),
and the client algorithm's events do not depend on which model it starts from. There are no
staleness weights: every update enters with the same weight ``server_lr / num_clients`` (the
configured count, never the contributors or a client's metrics), and the ages are drawn from
``(seed, round, client index)`` alone, so neither depends on private data or changes a
record's sensitivity.

References
----------
van Dijk et al., "Generalizing DP-SGD with Shuffling and Batch Clipping" (arXiv:2212.05796), Sec. 3
("Asynchronous SGD"); Nguyen et al. 2018 (bounded asynchrony keeps SGD's rates).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from flwr.app import Message
from flwr.serverapp import Grid

from fedpriv.common.errors import check
from fedpriv.run.aggregation import RoundFailed
from strategies.fedavg import DPFedAvg, ServerJob, wait_for_nodes


@dataclass
class AsyncDPFedAvg(DPFedAvg):
    """DP FedAvg whose clients compute on global models up to ``max_staleness`` rounds old.

    Parameters
    ----------
    server_lr : float
        Server step size (as :class:`~strategies.fedavg.DPFedAvg`).
    max_staleness : int
        Largest age (in released rounds) of the model a client computes on; 0 = synchronous.
    seed : int
        Seeds the staleness draws (the run's ``seed``).

    Raises
    ------
    ConfigError
        If ``max_staleness`` is negative or ``server_lr`` not > 0.
    """

    max_staleness: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        self._history: list[dict[str, np.ndarray]] = []  # the last max_staleness+1 models
        check(
            isinstance(self.max_staleness, int) and self.max_staleness >= 0,
            "strategy.max_staleness",
            self.max_staleness,
            "must be an integer >= 0",
        )

    def staleness(self, server_round: int, client_index: int, released: int) -> int:
        """Age ``tau`` of the model client ``client_index`` computes on in ``server_round``.

        Uniform on ``{0, ..., min(max_staleness, released)}`` where ``released`` counts the
        models published so far after the initial one; reproducible from ``seed``.
        """
        hi = min(self.max_staleness, released)
        if hi == 0:
            return 0
        rng = np.random.default_rng([int(self.seed), int(server_round), int(client_index), 0xA5])
        return int(rng.integers(0, hi + 1))

    def stale_messages(
        self,
        job: ServerJob,
        node_ids: list[int],
        cohort: list[int],
        history: list[dict[str, np.ndarray]],
        server_round: int,
    ) -> tuple[list[Message], list[int]]:
        """The round's TRAIN messages, clients grouped by the age of their model; the ages.

        ``history[-1]`` is the current model, ``history[-1 - tau]`` the one ``tau`` releases
        ago; client ``c`` computes on the model of age :meth:`staleness` ``(round, c, ...)``.
        """
        ages = [self.staleness(server_round, c, len(history) - 1) for c in cohort]
        messages: list[Message] = []
        for tau in sorted(set(ages)):
            group = [c for c, a in zip(cohort, ages) if a == tau]
            messages += job.messages_for(node_ids, group, history[-1 - tau], server_round)
        return messages, ages

    def check_algorithm(self, algorithm: object) -> None:
        """Refuse check-ins and client-level DP (each stale update would be its own release,
        which its round events do not account)."""
        super().check_algorithm(algorithm)
        if getattr(algorithm, "privacy_unit", "record") == "client":
            from fedpriv.common.errors import ConfigError

            raise ConfigError(
                "strategy", "async_fedavg", "cannot run client-level DP: use strategy=fedavg"
            )

    def checkpoint_state(self) -> dict[str, np.ndarray]:
        """The optimizer's moments and the recent models (``"history/<age>/<param>"``)."""
        out = super().checkpoint_state()
        for i, state in enumerate(self._history):
            out |= {f"history/{i}/{k}": np.asarray(v) for k, v in state.items()}
        return out

    def restore_checkpoint_state(self, arrays: dict[str, np.ndarray]) -> None:
        """Inverse of :meth:`checkpoint_state`."""
        super().restore_checkpoint_state(
            {k: v for k, v in arrays.items() if not k.startswith("history/")}
        )
        models: dict[int, dict[str, np.ndarray]] = {}
        for flat, arr in arrays.items():
            if flat.startswith("history/"):
                _, i, key = flat.split("/", 2)
                models.setdefault(int(i), {})[key] = np.array(arr)
        self._history = [models[i] for i in sorted(models)]

    def run(self, grid: Grid, job: ServerJob) -> dict[str, np.ndarray]:
        """The server's main loop from ``job.first_round``; returns the final global state."""
        node_ids = wait_for_nodes(grid, job.num_nodes, job.round_timeout)
        if hasattr(grid, "pull_interval"):
            grid.pull_interval = self.pull_interval
        history = self._history or [job.initial_state()]
        self._history = history
        for server_round in range(getattr(job, "first_round", 1), job.num_rounds + 1):
            if not job.may_start_round(server_round):
                break
            t0 = time.monotonic()
            cohort = job.draw_cohort(server_round)
            if not cohort:
                job.round_empty(server_round)
                continue
            messages, ages = self.stale_messages(job, node_ids, cohort, history, server_round)
            try:
                result = job.aggregator.sum_updates(
                    grid, messages, server_round=server_round, timeout=job.round_timeout
                )
                job.admit(result, server_round)  # a sum with dropouts must be accountable
            except RoundFailed as exc:
                job.round_failed(server_round, exc, time.monotonic() - t0)
                continue
            result.total = job.decode_sum(result.total, server_round)
            state = self.apply(history[-1], result, job.mean_divisor)
            history = (history + [state])[-(self.max_staleness + 1) :]
            self._history = history
            job.round_released(
                server_round,
                state,
                result,
                time.monotonic() - t0,
                extra={"mean_staleness": float(np.mean(ages))},
                contributors=result.num_clients,
            )
        return history[-1]
