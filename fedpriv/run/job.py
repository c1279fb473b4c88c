"""The run as the server strategy sees it: a typed job with every service a round needs.

:class:`ServerJob` holds the plan, the client algorithm and its bound privacy spec, the
aggregator, the layout and the run's ledgers; it draws cohorts, builds messages, sums and
admits replies (a sum the run cannot account fails the round), decodes and releases the sum,
evaluates, and records every round (row, ledger, checkpoint: :mod:`fedpriv.run.round_log`).
Strategies (:class:`fedpriv.run.strategy.Strategy`) use it; none reaches into the run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
from flwr.app import Message
from flwr.serverapp import Grid

from fedpriv.accounting.core.privacy_spec import PrivacySpec, UnaccountableRound
from fedpriv.common.errors import ConfigError
from fedpriv.mechanisms.client_sampling import CohortSampler
from fedpriv.mechanisms.enforced_cohort import AvailabilityTrace, EnforcedCohort
from fedpriv.models.evaluate import evaluate
from fedpriv.run.aggregation import AggregateResult, Aggregator, RoundFailed
from fedpriv.run.algorithm import ClientAlgorithm
from fedpriv.run.audit import RunAudit
from fedpriv.run.engine import clients_in, node_messages, worker_messages
from fedpriv.run.layout import Layout
from fedpriv.run.plan import RoundFailure, RunPlan
from fedpriv.run.round_log import RoundLog, RunFailed, dropped_note
from fedpriv.run.run_privacy import RunPrivacy
from fedpriv.run.setup import build_model_for, run_dataset

#: The global model: parameter name -> array.
State = dict[str, np.ndarray]


@dataclass
class Released:
    """A round's release, as :meth:`Strategy.train_round` returns it.

    Attributes
    ----------
    state : State
        The new global model.
    result : AggregateResult
        What the aggregator revealed (its ``num_clients`` contributors' noise is in the sum).
    figures : dict[str, float]
        The strategy's figures for the round's row (e.g. ``mean_staleness``).
    """

    state: State
    result: AggregateResult
    figures: dict[str, float] = field(default_factory=dict)


#: Extra seconds of the first round's ``round_timeout`` (Ray starts the client actors then).
STARTUP_ALLOWANCE_S = 120.0


class ServerJob:
    """The run's services for a strategy (see the module docstring).

    Parameters
    ----------
    plan : RunPlan
        The validated run.
    algorithm : ClientAlgorithm
        The run's client algorithm, bound to the plan (its ``privacy`` is ``plan.privacy``).
    aggregator : Aggregator
        Sends the train messages and returns only the sum of the updates.
    layout : Layout
        Workers and cohorts.
    log : RoundLog
        Records rows, ledgers and checkpoints.
    """

    def __init__(
        self,
        plan: RunPlan,
        algorithm: ClientAlgorithm,
        aggregator: Aggregator,
        layout: Layout,
        log: RoundLog,
    ) -> None:
        self.plan = plan
        self.algorithm = algorithm
        self.aggregator = aggregator
        self.layout = layout
        self.log = log
        self.privacy: RunPrivacy = log.privacy
        self.num_clients = plan.num_clients
        self.num_rounds = plan.num_rounds
        self.cohort_size = 0 if layout.cohort.varies else layout.cohort.nominal_size
        self.cohorts = cohorts_for(plan.privacy, layout.cohort, plan.availability)
        self._note_empty_rounds()
        self.model = build_model_for(plan)
        ds = run_dataset(plan)
        self.x_test, self.y_test = ds.x_test, ds.y_test
        self.state: State = {
            k: v.detach().cpu().numpy().copy() for k, v in self.model.state_dict().items()
        }
        self.round_config: dict[str, float] = dict(algorithm.initial_round_config())
        self.audit = RunAudit.for_run(plan, algorithm, self.model)  # audit=canaries, else None
        self.release_figures: dict[str, float] = {}
        self.first_round = 1
        self.rounds_ended = 0  # rounds ended (released, failed, empty) in this process
        self.interrupted = ""  # set by SIGINT/SIGTERM: finish the round in progress, then stop
        self.stop_signal = 0  # the number of that signal (the exit code is 128 + it)
        self.record_nodes(set())  # results.json states its engine from the start

    def _note_empty_rounds(self) -> None:
        """One line when the enforced participation leaves rounds without any client (they
        release nothing: e.g. participation=single with every client sampled in round 1)."""
        if not isinstance(self.cohorts, EnforcedCohort):
            return
        self.cohorts.expected_cohort_size(self.num_rounds)  # the dry run counts them
        empty = self.cohorts.empty_rounds
        if empty:
            self.log.display.note(
                f"note: {empty} of {self.num_rounds} rounds have an empty cohort under the "
                "enforced participation (nothing trains or is released in them); sample fewer "
                "clients per round (client_sampling) or allow more participations"
            )

    # ---- what a strategy reads ---------------------------------------------------------
    @property
    def spec(self) -> PrivacySpec:
        """The run's bound privacy spec (the events and the noise of every release)."""
        return self.plan.privacy

    @property
    def stop_reason(self) -> str:
        """Why the run stopped early ('' if it did not)."""
        return self.log.stop_reason

    @property
    def round_timeout(self) -> float:
        """Seconds a round may wait for its replies: ``round_timeout``, plus
        :data:`STARTUP_ALLOWANCE_S` until a round has ended in this process (the first round
        also starts Ray's client actors, which takes 10-60 s on a loaded machine)."""
        extra = 0.0 if self.rounds_ended else STARTUP_ALLOWANCE_S
        return self.plan.round_timeout + extra

    @property
    def mean_divisor(self) -> float:
        """The public divisor of the summed update: the expected cohort size (``N``, ``qN``,
        ``k``; an enforced participation: the algorithm's normalizer, the enforced cohort's
        expected size), never the number of clients that contributed."""
        if isinstance(self.cohorts, EnforcedCohort):
            return float(self.algorithm.normalizer)
        return self.layout.cohort.expected_size

    def initial_state(self) -> State:
        """The model the rounds start from (initial, or the resumed checkpoint's)."""
        return dict(self.state)

    def connect(self, grid: Grid, pull_interval: float) -> list[int]:
        """Wait for the run's Flower nodes (sorted ids) and set the grid's reply polling
        (Flower's in-memory grid polls; the processes engine's grid waits on its pipes).

        Raises
        ------
        TimeoutError
            If they have not all registered within the round timeout.
        """
        if hasattr(grid, "pull_interval"):  # Flower's InMemoryGrid (0.6 s to import)
            grid.pull_interval = pull_interval
        return wait_for_nodes(grid, self.layout.num_workers, self.round_timeout)

    def note(self, text: str) -> None:
        """Print a line above the progress bar."""
        self.log.display.note(text)

    # ---- a round -----------------------------------------------------------------------
    def may_start_round(self, server_round: int) -> bool:
        """False (and the reason noted) if the run must stop before ``server_round``: a
        signal, or ``privacy.stop_at_epsilon`` that the round would exceed."""
        if self.interrupted:
            reason = f"stopped before round {server_round}: {self.interrupted} received"
            self.log.stop_reason = reason
            return False
        varies = self.layout.cohort.varies or isinstance(self.cohorts, EnforcedCohort)
        size = len(self.cohorts.draw(server_round)) if varies else None
        if size == 0:
            return True  # an empty Poisson cohort: the round is recorded as empty
        if self.privacy.next_round_exceeds_budget(size, server_round):
            self.log.stop_reason = (
                f"stopped before round {server_round}: it would exceed "
                f"privacy.stop_at_epsilon={self.privacy.stop_at_epsilon}"
            )
            self.note(self.log.stop_reason)
            return False
        return True

    def draw_cohort(self, server_round: int) -> list[int]:
        """The round's client ids (sorted; may be empty for Poisson sampling or an enforced
        participation pattern)."""
        return [int(c) for c in self.cohorts.draw(server_round)]

    def messages_for(
        self, node_ids: list[int], clients: list[int], state: State, server_round: int
    ) -> list[Message]:
        """Train messages asking ``clients`` to train from ``state`` (worker or node layout)."""
        self.log.mark_started(server_round)  # before anything is sent (secure mode)
        rc = self.round_config
        if self.layout.one_node_per_client:
            return node_messages([node_ids[c] for c in clients], state, server_round, rc)
        summed = self.aggregator.sums_on_workers
        return worker_messages(node_ids, clients, state, server_round, rc, summed=summed)

    def sum_updates(
        self, grid: Grid, messages: list[Message], server_round: int
    ) -> AggregateResult:
        """The aggregator's sum of the replies to ``messages``, admitted (:meth:`admit`); the
        clients the messages ask to train are the round's expected contributors.

        Raises
        ------
        RoundFailed
            If the aggregator fails, or the sum cannot be accounted.
        """
        self.cohort_size = clients_in(messages)
        result = self.aggregator.sum_updates(
            grid, messages, server_round=server_round, timeout=self.round_timeout
        )
        self.admit(result, server_round)
        self.record_nodes(result.nodes)
        return result

    def record_nodes(self, nodes: set[str]) -> None:
        """``results.json`` ``engine``: its kind (``processes`` or ``ray``), the worker count
        and every Ray node a reply came from (one run spread over a cluster shows each)."""
        layout = self.layout
        engine = self.log.recorder.extra.setdefault(
            "engine",
            {"kind": layout.engine.value, "num_workers": layout.num_workers, "ray_nodes": []},
        )
        engine["ray_nodes"] = sorted(set(engine["ray_nodes"]) | nodes)

    def admit(self, result: AggregateResult, server_round: int) -> None:
        """Refuse (RoundFailed) a sum the run cannot account, before anything is released.

        A sum with fewer contributors than the nominal cohort (dropouts, non-finite updates
        left out by the aggregator, a small Poisson cohort) is accounted with the spec's
        ``degraded_round_events``; a spec without them fails the round: model unchanged,
        nothing accounted.

        Raises
        ------
        RoundFailed
            If the degraded round cannot be accounted.
        RunFailed
            Under ``round_failure=stop`` when a client is missing.
        """
        self.log.client_errors(server_round, result.errors)
        missing = self.cohort_size > result.num_clients
        if self.plan.round_failure is RoundFailure.STOP and missing:
            raise RunFailed(
                self.log.stop_line(
                    server_round, result.errors, result, cohort_size=self.cohort_size
                )
            )
        if result.num_clients < self.privacy.nominal_cohort:
            try:
                self.privacy.round_events(result.num_clients)
            except (UnaccountableRound, ConfigError) as exc:
                raise RoundFailed(
                    f"round {server_round}: {dropped_note(self.cohort_size, result)}; "
                    f"not released: {exc}",
                    num_ok=result.num_clients,
                ) from None
        self.log.mark_started(server_round, result.num_clients)

    def decode_sum(self, total: State, server_round: int) -> State:
        """The real-valued sum of the clients' deltas to apply: the algorithm decodes it (e.g.
        integers) and releases it (``release``: e.g. the trusted aggregator's noise, the next
        round's adaptive clip norm); the release's figures go into the round's row."""
        shapes = {k: tuple(p.shape) for k, p in self.model.named_parameters() if p.requires_grad}
        decoded = self.algorithm.sum_figures(total, server_round)
        total = self.algorithm.decode_sum(total, shapes, server_round)
        if self.audit is not None:  # canary clients, covered by the release's noise
            total = self.audit.before_release(total, server_round, self.round_config)
        total, figures, self.round_config = self.algorithm.release(
            total, server_round, self.round_config
        )
        self.release_figures = {**decoded, **figures}
        return total

    def evaluate_state(self, state: State) -> tuple[float, float]:
        """``(accuracy, loss)`` of ``state`` on the test split (the job's model is unchanged)."""
        model = build_model_for(self.plan)
        model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
        return evaluate(model, self.x_test, self.y_test)

    # ---- recording (the loop calls these) ----------------------------------------------
    def round_released(
        self,
        server_round: int,
        released: Released,
        metrics: dict[str, float],
        seconds: float,
    ) -> None:
        """Account and record a released round (its contributors' noise), then checkpoint."""
        self.rounds_ended += 1
        self.state = released.state
        self.model.load_state_dict({k: torch.from_numpy(v) for k, v in self.state.items()})
        figures = {**self.release_figures, **released.figures}
        if isinstance(self.cohorts, EnforcedCohort):  # the enforced pattern, as a fact
            figures["max_client_participations"] = float(self.cohorts.participations().max())
        if self.audit is not None:
            figures.update(self.audit.round_figures(self.model, self.state))
            self.log.recorder.update_privacy(**self.audit.summary)
        self.log.released(
            server_round, released.result, self.cohort_size, metrics, figures, seconds
        )
        self.save_checkpoint(server_round)

    def round_empty(self, server_round: int) -> None:
        """Record a round whose Poisson cohort is empty: nothing trained, released or accounted."""
        self.rounds_ended += 1
        self.log.empty(server_round)
        self.save_checkpoint(server_round)

    def round_failed(self, server_round: int, error: RoundFailed, seconds: float) -> None:
        """Record a failed round (model unchanged, no release); stop the run if no client
        succeeded or under ``round_failure=stop``.

        Raises
        ------
        RunFailed
            Under ``round_failure=stop``.
        RuntimeError
            If every client failed.
        """
        self.rounds_ended += 1
        self.log.failed(server_round, error, seconds, self.plan.round_failure)
        self.save_checkpoint(server_round)
        if error.num_ok == 0:
            raise RuntimeError(
                f"every client failed in round {server_round}; stopping the run: {error}"
            )

    def account_aborted_round(self) -> None:
        """The server saw part of a round that then failed: account the whole round (a prefix
        of its transcript is post-processing of it), so ε is never under-reported."""
        self.log.account_aborted()

    def save_checkpoint(self, server_round: int) -> None:
        """The checkpoint after ``server_round`` (model, strategy state, ledgers, rows)."""
        self.log.save_checkpoint(server_round, self.state, self.round_config)


def cohorts_for(
    spec: PrivacySpec, sampler: CohortSampler, availability: AvailabilityTrace | None = None
) -> CohortSampler | EnforcedCohort:
    """The run's cohorts: the sampler's, filtered by the devices' availability and by the
    participation pattern the spec's events need (the server enforces it:
    :mod:`fedpriv.mechanisms.enforced_cohort`)."""
    pattern = spec.enforced_participation()
    if pattern is None:
        return sampler
    return EnforcedCohort(sampler, pattern, availability=availability, seed=sampler.seed)


def wait_for_nodes(grid: Grid, num_nodes: int, timeout: float) -> list[int]:
    """Node ids once ``num_nodes`` are registered (sorted Python ints).

    Raises
    ------
    TimeoutError
        After ``timeout`` seconds.
    """
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
