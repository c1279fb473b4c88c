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

from dataclasses import dataclass, field

import numpy as np
from flwr.app import Message

from fedpriv.common.errors import check
from fedpriv.run.algorithm import ClientAlgorithm, PrivacyUnit
from fedpriv.run.job import ServerJob, State
from strategies.fedavg import DPFedAvg


@dataclass
class AsyncDPFedAvg(DPFedAvg):
    """DP FedAvg whose clients compute on global models up to ``max_staleness`` rounds old.

    Parameters
    ----------
    max_staleness : int
        Largest age (in released rounds) of the model a client computes on, >= 0; 0 =
        synchronous.
    seed : int
        Seeds the staleness draws (the run's ``seed``).
    (and the parameters of :class:`~strategies.fedavg.DPFedAvg`)

    Raises
    ------
    ConfigError
        If ``max_staleness`` is negative or ``server_lr`` not > 0.
    """

    max_staleness: int = 2
    seed: int = 0
    _history: list[State] = field(default_factory=list, init=False)  # the last max_staleness+1
    _ages: list[int] = field(default_factory=list, init=False)  # the current round's

    def __post_init__(self) -> None:
        super().__post_init__()
        check(
            isinstance(self.max_staleness, int) and self.max_staleness >= 0,
            "strategy.max_staleness",
            self.max_staleness,
            "must be an integer >= 0",
        )

    def check_algorithm(self, algorithm: ClientAlgorithm) -> None:
        """Refuse check-ins and client-level DP (each stale update would be its own release,
        which its round events do not account)."""
        super().check_algorithm(algorithm)
        check(
            algorithm.privacy_unit is not PrivacyUnit.CLIENT,
            "strategy",
            "async_fedavg",
            "cannot run client-level DP: use strategy=fedavg",
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

    def initial_state(self, job: ServerJob) -> State:
        """The current model; the recent ones come from the checkpoint after a resume."""
        if not self._history:
            self._history = [job.initial_state()]
        return self._history[-1]

    def configure_train(
        self,
        server_round: int,
        state: State,
        cohort: list[int],
        node_ids: list[int],
        job: ServerJob,
    ) -> list[Message]:
        """The round's train messages, clients grouped by the age of their model:
        ``history[-1 - tau]`` for client ``c`` of age :meth:`staleness` ``(round, c, ...)``."""
        history = self._history
        self._ages = [self.staleness(server_round, c, len(history) - 1) for c in cohort]
        messages: list[Message] = []
        for tau in sorted(set(self._ages)):
            group = [c for c, a in zip(cohort, self._ages) if a == tau]
            messages += job.messages_for(node_ids, group, history[-1 - tau], server_round)
        return messages

    def aggregate_train(
        self, server_round: int, state: State, total: State, job: ServerJob
    ) -> tuple[State, dict[str, float]]:
        """Apply the sum to the CURRENT model (as updates arrive); keep the recent models."""
        new = self.apply(self._history[-1], total, job.mean_divisor)
        self._history = (self._history + [new])[-(self.max_staleness + 1) :]
        return new, {"mean_staleness": float(np.mean(self._ages))}

    def checkpoint_state(self) -> State:
        """The optimizer's moments and the recent models (``"history/<age>/<param>"``)."""
        out = super().checkpoint_state()
        for i, model in enumerate(self._history):
            out |= {f"history/{i}/{k}": np.asarray(v) for k, v in model.items()}
        return out

    def restore_checkpoint_state(self, arrays: State) -> None:
        """Inverse of :meth:`checkpoint_state`."""
        super().restore_checkpoint_state(
            {k: v for k, v in arrays.items() if not k.startswith("history/")}
        )
        models: dict[int, State] = {}
        for flat, arr in arrays.items():
            if flat.startswith("history/"):
                _, i, key = flat.split("/", 2)
                models.setdefault(int(i), {})[key] = np.array(arr)
        self._history = [models[i] for i in sorted(models)]
