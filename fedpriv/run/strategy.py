"""The server strategy base: fedpriv's round loop, written once, and the hooks a strategy overrides.

The loop (:meth:`Strategy.start`) waits for the Flower nodes, starts at the first round after a
resumed checkpoint, stops before a round that would exceed ``privacy.stop_at_epsilon`` or after
a signal, applies the failure policy, evaluates, records every round (row, ledger, checkpoint)
through the typed :class:`~fedpriv.run.job.ServerJob`. A strategy overrides hooks only, named
after Flower's message-API ``Strategy`` (``flwr.serverapp.strategy``):

- :meth:`Strategy.configure_train`: the round's train messages (default: the cohort's worker
  messages with the current model);
- :meth:`Strategy.aggregate_train`: the new global model from the decoded, released SUM of the
  clients' updates (the strategy never sees one client's update);
- :meth:`Strategy.evaluate`: centralized evaluation of the new model (default: the test split);
- :meth:`Strategy.train_round`: the whole training part of a round, for protocols of several
  exchanges (random check-ins: a query, then slot blocks);
- :meth:`Strategy.checkpoint_state` / :meth:`Strategy.restore_checkpoint_state`: the server
  optimizer's state in the checkpoint.

Where fedpriv departs from Flower's ``Strategy`` (``docs/architecture.md``): the aggregator, not
the strategy, exchanges the train messages and returns only their sum (SecAgg+ runs its own
stages through the grid), so ``aggregate_train`` takes the released sum, not the replies; there
is no client-side evaluation (a client's evaluation reply would be an unaccounted release);
``start`` takes the run's job (plan, ledger, recorder) instead of arrays and configs.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from flwr.app import Message
from flwr.serverapp import Grid

from fedpriv.common.errors import ConfigError, check
from fedpriv.run.aggregation import RoundFailed
from fedpriv.run.algorithm import ClientAlgorithm
from fedpriv.run.job import Released, ServerJob, State

#: Checkpoint keys of the parameter average (:meth:`Strategy.saved_state`).
EMA_PREFIX = "ema/"


def check_pull_interval(value: object) -> None:
    """Refuse a ``strategy.pull_interval`` that is not a number of seconds in (0, 1].

    Raises
    ------
    ConfigError
        ``strategy.pull_interval='abc' must be a number of seconds in (0, 1]``.
    """
    number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else -1
    if not (0 < number <= 1):
        raise ConfigError("strategy.pull_interval", value, "must be a number of seconds in (0, 1]")


@dataclass
class Strategy(ABC):
    """A fedpriv server strategy (see the module docstring).

    Parameters
    ----------
    pull_interval : float
        Seconds between the in-memory grid's reply polls, in (0, 1] (Flower's default 0.1 s
        adds up to 0.1 s to every exchange).
    ema_decay : float or None
        Evaluate the average ema = d ema + (1 - d) model of the released models (null: off).
        Parameter averaging (De et al. 2022, arXiv:2204.13650, Section 3.1): after each
        released round (the first released model starts it), evaluated beside the model
        (``ema_accuracy``, ``ema_loss``); post-processing, so ε is unchanged; ``d`` in [0, 1).

    Raises
    ------
    ConfigError
        For a value out of range (one line naming ``strategy.<field>``).
    """

    pull_interval: float = 0.01
    ema_decay: float | None = None
    #: Sends worker messages (many virtual clients per Flower node, sampled cohorts); False:
    #: one Flower node per client.
    virtual_clients: ClassVar[bool] = True
    #: Writes checkpoints (:meth:`checkpoint_state`) so that ``fedpriv resume=RUN_DIR`` works.
    resumable: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_pull_interval(self.pull_interval)
        d = self.ema_decay
        check(
            d is None or (isinstance(d, (int, float)) and 0 <= d < 1),
            "strategy.ema_decay",
            d,
            "must be null (off) or a decay in [0, 1)",
        )
        self._ema: State | None = None

    def check_algorithm(self, algorithm: ClientAlgorithm) -> None:
        """Refuse, before training, a client algorithm this strategy cannot serve (default: a
        check-in client, which needs ``strategy=checkin``).

        Raises
        ------
        ConfigError
            Naming ``client`` or ``strategy``.
        """
        check(
            not algorithm.checks_in,
            "client",
            type(algorithm).__name__,
            "needs strategy=checkin",
        )

    # ---- the loop ----------------------------------------------------------------------
    def start(self, grid: Grid, job: ServerJob) -> State:
        """The server's main loop from ``job.first_round`` (1, or the round after a resumed
        checkpoint) to ``num_rounds``; returns the final global model."""
        node_ids = job.connect(grid, self.pull_interval)
        state = self.initial_state(job)
        for server_round in range(job.first_round, job.num_rounds + 1):
            if not job.may_start_round(server_round):
                break
            state = self.play_round(grid, node_ids, job, server_round, state)
        return state

    def play_round(
        self, grid: Grid, node_ids: list[int], job: ServerJob, server_round: int, state: State
    ) -> State:
        """One round: train, then record it as released, empty or failed; the new model."""
        t0 = time.monotonic()
        try:
            released = self.train_round(grid, node_ids, job, server_round, state)
        except RoundFailed as exc:
            job.round_failed(server_round, exc, time.monotonic() - t0)
            return state
        if released is None:
            job.round_empty(server_round)
            return state
        metrics = self.evaluate(server_round, released.state, job)
        if self.ema_decay is not None:
            metrics |= self.evaluate_average(released.state, job)
        seconds = time.monotonic() - t0
        job.round_released(server_round, released, metrics, seconds)
        return released.state

    # ---- hooks -------------------------------------------------------------------------
    def initial_state(self, job: ServerJob) -> State:
        """The global model the loop starts from (the job's: initial or resumed)."""
        return job.initial_state()

    def train_round(
        self, grid: Grid, node_ids: list[int], job: ServerJob, server_round: int, state: State
    ) -> Released | None:
        """The training part of a round: the cohort, :meth:`configure_train`, the aggregator's
        sum (admitted: a sum the run cannot account fails the round), the algorithm's
        decoding and release, :meth:`aggregate_train`. ``None``: an empty cohort.

        Raises
        ------
        RoundFailed
            If the aggregator fails or the sum cannot be accounted (nothing is released).
        """
        cohort = job.draw_cohort(server_round)
        if not cohort:
            return None
        messages = self.configure_train(server_round, state, cohort, node_ids, job)
        result = job.sum_updates(grid, messages, server_round)
        total = job.decode_sum(result.total, server_round)
        new_state, figures = self.aggregate_train(server_round, state, total, job)
        return Released(new_state, result, figures)

    def configure_train(
        self,
        server_round: int,
        state: State,
        cohort: list[int],
        node_ids: list[int],
        job: ServerJob,
    ) -> list[Message]:
        """The round's train messages: ``cohort`` trains from ``state`` (default)."""
        return job.messages_for(node_ids, cohort, state, server_round)

    @abstractmethod
    def aggregate_train(
        self, server_round: int, state: State, total: State, job: ServerJob
    ) -> tuple[State, dict[str, float]]:
        """The new global model from ``total``, the released SUM of the clients' deltas
        (decoded, noised where the trusted aggregator adds the noise), and the strategy's
        figures for the round's row."""

    def evaluate(self, server_round: int, state: State, job: ServerJob) -> dict[str, float]:
        """Centralized evaluation of ``state``: ``accuracy`` and ``loss`` on the test split."""
        accuracy, loss = job.evaluate_state(state)
        return {"accuracy": accuracy, "loss": loss}

    def evaluate_average(self, state: State, job: ServerJob) -> dict[str, float]:
        """Fold the released ``state`` into the parameter average (``ema_decay``) and evaluate
        the average: ``ema_accuracy``, ``ema_loss``. Non-float arrays follow the model."""
        d, ema = float(self.ema_decay or 0.0), self._ema
        self._ema = {
            k: v.copy()
            if ema is None or not np.issubdtype(v.dtype, np.floating)
            else (d * ema[k] + (1 - d) * v).astype(v.dtype)
            for k, v in state.items()
        }
        accuracy, loss = job.evaluate_state(self._ema)
        return {"ema_accuracy": accuracy, "ema_loss": loss}

    def saved_state(self) -> State:
        """What a checkpoint keeps of the strategy: :meth:`checkpoint_state` and the parameter
        average (``"ema/<param>"``)."""
        ema = {} if self._ema is None else {EMA_PREFIX + k: v for k, v in self._ema.items()}
        return {**self.checkpoint_state(), **ema}

    def restore_saved_state(self, arrays: State) -> None:
        """Inverse of :meth:`saved_state`."""
        ema = {k[len(EMA_PREFIX) :]: v for k, v in arrays.items() if k.startswith(EMA_PREFIX)}
        self._ema = ema or None
        self.restore_checkpoint_state(
            {k: v for k, v in arrays.items() if not k.startswith(EMA_PREFIX)}
        )

    def checkpoint_state(self) -> State:
        """The strategy's state for the checkpoint, as flat arrays (default: none)."""
        return {}

    def restore_checkpoint_state(self, arrays: State) -> None:  # noqa: B027 (a hook)
        """Inverse of :meth:`checkpoint_state` (default: nothing to restore)."""
