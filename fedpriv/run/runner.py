"""Runs one experiment: validates the config, builds the Flower apps and runs them on
Flower's simulation engine (Ray backend), recording accuracy and ε every round.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Context, Message
from flwr.serverapp import Grid, ServerApp
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from fedpriv.accounting.spec import NoiseSource, parse_enum
from fedpriv.common.errors import ConfigError, build_error, check
from fedpriv.common.notices import quiet_known_notices
from fedpriv.data.shared import unshare
from fedpriv.mechanisms.client_sampling import CohortSampler
from fedpriv.mechanisms.vmap_clients import dense_chain
from fedpriv.models.evaluate import evaluate
from fedpriv.report.display import RoundDisplay
from fedpriv.report.results import RunRecorder
from fedpriv.run.aggregation import AggregateResult, RoundFailed, RoundFailure, aggregator_class
from fedpriv.run.audit import RunAudit, check_audit
from fedpriv.run.client_app import make_client_app
from fedpriv.run.config import to_container, validate
from fedpriv.run.engine import node_messages, worker_messages
from fedpriv.run.layout import Layout, plan_layout
from fedpriv.run.ray_session import release_stuck_clients, start_ray
from fedpriv.run.run_privacy import RunPrivacy
from fedpriv.run.setup import (
    build_algorithm,
    build_model_for,
    partitions,
    resolve_device,
    run_dataset,
    share_run_dataset,
)

#: Extra seconds of the first round's ``round_timeout`` (Ray starts the client actors then).
STARTUP_ALLOWANCE_S = 120.0

DEFAULT_RAY_INIT = {"include_dashboard": False, "logging_level": "ERROR", "log_to_driver": True}


class Job:
    """The run as the strategy sees it (:class:`strategies.fedavg.ServerJob`)."""

    def __init__(
        self,
        cfg: dict[str, Any],
        algorithm: Any,
        aggregator: Any,
        recorder: RunRecorder,
        display: RoundDisplay,
        layout: Layout | None = None,
    ) -> None:
        self.cfg = cfg
        self.num_clients = int(cfg["num_clients"])
        self.layout = layout = layout or run_layout(cfg)
        self.cohort_size = 0 if layout.cohort.varies else layout.cohort.nominal_size
        self.num_rounds = int(cfg["num_rounds"])
        self.base_round_timeout = float(cfg["round_timeout"])
        self.rounds_ended = 0  # rounds ended (released, failed, empty) in this process
        self.round_failure = RoundFailure(cfg.get("round_failure", "drop"))
        self.aggregator = aggregator
        self.recorder = recorder
        self.display = display
        self.privacy = RunPrivacy(algorithm, cfg["privacy"])
        self.model = build_model_for(cfg)
        ds = run_dataset(cfg)
        self.x_test, self.y_test = ds.x_test, ds.y_test
        self.state: dict[str, np.ndarray] = {
            k: v.detach().cpu().numpy().copy() for k, v in self.model.state_dict().items()
        }
        self.round_config: dict[str, float] = dict(algorithm.initial_round_config())
        self.audit = RunAudit.for_run(cfg, algorithm, self.model)  # audit=canaries, else None
        self.release_figures: dict[str, float] = {}
        self.stop_reason = ""
        self.interrupted = ""  # set by SIGINT/SIGTERM: finish the round in progress, then stop
        self.stop_signal = 0  # the number of that signal (the exit code is 128 + it)
        # checkpoints (fedpriv.run.checkpoint): set by run_experiment for a resumable strategy
        self.first_round = 1
        self.checkpoint_dir: Path | None = None
        self.strategy: Any = None
        self.secure = bool(cfg["privacy"].get("secure_mode"))
        self.lost_markers: list[str] = []
        self.wall_before = 0.0  # seconds run before the last resume
        self._t0 = time.monotonic()
        self._marker: tuple[int, str] = (0, "")  # (round, id) of round_started.json

    def save_checkpoint(self, server_round: int) -> None:
        """Write the checkpoint after ``server_round`` (0: before the first round): model,
        strategy state, ledgers and rows in one atomic file (:mod:`fedpriv.run.checkpoint`)."""
        if self.checkpoint_dir is None:
            return
        from fedpriv.report.results import _json_safe
        from fedpriv.run import checkpoint

        meta = {
            "privacy": self.privacy.state_dict(),
            "round_config": dict(self.round_config),
            "rows": self.recorder.rounds,
            "recorder_privacy": self.recorder.privacy,
            "lost_markers": self.lost_markers,
            "wall_time_s": self.wall_before + time.monotonic() - self._t0,
            "resumed": self.recorder.extra.get("resumed", []),
        }
        strategy_state = self.strategy.checkpoint_state() if self.strategy is not None else {}
        checkpoint.save(
            self.checkpoint_dir, server_round, self.state, strategy_state, _json_safe(meta)
        )

    def restore(self, ckpt: Any) -> None:
        """Continue from a loaded :class:`fedpriv.run.checkpoint.Checkpoint` (round, model,
        ledgers, round config, strategy state); the recorder was built with its rows."""
        meta = ckpt.meta
        self.first_round = ckpt.round + 1
        self.state = {k: np.array(v) for k, v in ckpt.model.items()}
        self.model.load_state_dict({k: torch.from_numpy(v) for k, v in self.state.items()})
        self.privacy.load_state_dict(meta["privacy"])
        self.round_config = {k: float(v) for k, v in meta.get("round_config", {}).items()}
        self.lost_markers = list(meta.get("lost_markers", []))
        self.wall_before = float(meta.get("wall_time_s", 0.0))
        if self.strategy is not None:
            self.strategy.restore_checkpoint_state(ckpt.strategy)

    def account_lost_round(self, marker: dict[str, Any]) -> None:
        """Secure mode: count a round started after the last checkpoint as released (its redo
        draws new noise: a second release); whole-epoch events are composed again."""
        contributors = marker.get("contributors")
        self.privacy.record_round(None if contributors is None else int(contributors), 0)
        self.lost_markers.append(marker["id"])
        row = {
            "server_round": marker["round"],
            "status": "lost",
            "message": (
                f"round {marker['round']} was started and not saved (process killed); "
                "accounted as released: in secure_mode its redo is a new release"
            ),
            "round_time_s": 0.0,
            "epsilon": self.privacy.epsilon(),
        }
        self.recorder.update_privacy(
            epsilon=row["epsilon"],
            local_epsilon=self.privacy.local_epsilon(),
            rounds_released=self.privacy.rounds,
            ledger=self.privacy.central.to_dict(),
        )
        self.recorder.log_round(row)
        self.display.row(row)
        self.save_checkpoint(self.first_round - 1)

    def _mark_started(self, server_round: int, contributors: int | None = None) -> None:
        if not self.secure or self.checkpoint_dir is None:
            return
        from fedpriv.run import checkpoint

        if self._marker[0] != server_round:  # a new attempt: a new id
            self._marker = (server_round, checkpoint.new_marker_id())
        checkpoint.mark_started(self.checkpoint_dir, server_round, self._marker[1], contributors)

    @property
    def round_timeout(self) -> float:
        """Seconds a round may wait for its replies: ``round_timeout``, plus
        :data:`STARTUP_ALLOWANCE_S` until a round has ended in this process (the first round
        also starts Ray's client actors, which takes 10-60 s on a loaded machine)."""
        return self.base_round_timeout + (0.0 if self.rounds_ended else STARTUP_ALLOWANCE_S)

    def initial_state(self) -> dict[str, np.ndarray]:
        return dict(self.state)

    @property
    def num_nodes(self) -> int:
        """Flower nodes of the run (workers, or one per client)."""
        return self.layout.num_workers

    @property
    def mean_divisor(self) -> float:
        """The public divisor of the summed update: the expected cohort size (``N``, ``qN``,
        ``k``), never the number of clients that contributed."""
        return self.layout.cohort.expected_size

    def draw_cohort(self, server_round: int) -> list[int]:
        """The round's client ids (sorted); remembered as the round's expected contributors."""
        cohort = self.layout.cohort.draw(server_round).tolist()
        self.cohort_size = len(cohort)
        return cohort

    def messages_for(
        self,
        node_ids: list[int],
        clients: list[int],
        state: dict[str, np.ndarray],
        server_round: int,
    ) -> list[Message]:
        """Train messages asking ``clients`` to train from ``state`` (worker or node layout)."""
        rc = self.round_config
        self._mark_started(server_round)  # before anything is sent (secure mode)
        if self.layout.one_node_per_client:
            return node_messages([node_ids[c] for c in clients], state, server_round, rc)
        return worker_messages(node_ids, clients, state, server_round, rc)

    def may_start_round(self, server_round: int) -> bool:
        if self.interrupted:
            self.stop_reason = f"stopped before round {server_round}: {self.interrupted} received"
            return False
        cohort = len(self.layout.cohort.draw(server_round)) if self.layout.cohort.varies else None
        if cohort == 0:
            return True  # an empty Poisson cohort: the strategy records the round as empty
        if self.privacy.next_round_exceeds_budget(cohort, server_round):
            self.stop_reason = (
                f"stopped before round {server_round}: it would exceed "
                f"privacy.stop_at_epsilon={self.privacy.stop_at_epsilon}"
            )
            self.display.note(self.stop_reason)
            return False
        return True

    def evaluate_state(self, state: dict[str, np.ndarray]) -> tuple[float, float]:
        """``(accuracy, loss)`` of ``state`` on the test split (the job's model is unchanged)."""
        model = build_model_for(self.cfg)
        model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
        return evaluate(model, self.x_test, self.y_test)

    def note(self, text: str) -> None:
        """Print a line above the progress bar."""
        self.display.note(text)

    def decode_sum(self, total: dict[str, np.ndarray], server_round: int) -> dict[str, np.ndarray]:
        """The real-valued sum of the clients' deltas to apply: the algorithm decodes it (e.g.
        integers) and releases it (``release``: e.g. the trusted aggregator's noise, the next
        round's adaptive clip norm); the release's figures go into the round's row."""
        algorithm = self.privacy.algorithm
        shapes = {k: tuple(p.shape) for k, p in self.model.named_parameters() if p.requires_grad}
        total = algorithm.decode_sum(total, shapes, server_round)
        if self.audit is not None:  # canary clients, covered by the release's noise
            total = self.audit.before_release(total, server_round, self.round_config)
        total, self.release_figures, self.round_config = algorithm.release(
            total, server_round, self.round_config
        )
        return total

    def admit(self, result: AggregateResult, server_round: int) -> None:
        """Refuse (RoundFailed) a sum the run cannot account, before anything is released.

        A sum with fewer contributors than the algorithm's noise shares (the nominal cohort:
        dropouts, non-finite updates left out by the aggregator, a small Poisson cohort) is
        accounted with the algorithm's ``degraded_round_events``; an
        algorithm without them (or for which too few clients remain) fails the round: model
        unchanged, nothing accounted.

        Raises
        ------
        RoundFailed
            If the degraded round cannot be accounted.
        """
        self.client_errors(server_round, result.errors)
        if self.round_failure is RoundFailure.STOP and self.cohort_size > result.num_clients:
            raise RunFailed(self.stop_line(server_round, result.errors, result))
        if result.num_clients >= self.privacy.algorithm.num_clients:
            self._mark_started(server_round, result.num_clients)
            return
        try:
            self.privacy.algorithm.degraded_round_events(result.num_clients)
        except (NotImplementedError, ConfigError) as exc:
            raise RoundFailed(
                f"round {server_round}: {dropped_note(self.cohort_size, result)}; "
                f"not released: {exc}",
                num_ok=result.num_clients,
            ) from None
        self._mark_started(server_round, result.num_clients)

    def round_released(
        self,
        server_round: int,
        state: dict[str, np.ndarray],
        result: AggregateResult,
        seconds: float,
        extra: dict[str, Any] | None = None,
        contributors: int | None = None,
    ) -> None:
        """Record a released round; ``extra`` adds strategy figures to its row (floats are printed).

        ``contributors``: clients whose noise is in the released sum, when fewer than all
        (dropouts); the round is then accounted with the algorithm's degraded events.
        """
        self.rounds_ended += 1
        self.privacy.record_round(contributors, server_round)
        dropped = max(self.cohort_size - contributors, 0) if contributors is not None else 0
        self.state = state
        self.model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
        accuracy, loss = evaluate(self.model, self.x_test, self.y_test)
        row = {
            "server_round": server_round,
            "accuracy": accuracy,
            "loss": loss,
            "epsilon": self.privacy.epsilon(),
            "local_epsilon": self.privacy.local_epsilon(),
            "round_time_s": seconds,
            "status": "ok",
            "client_metrics": {k: v for k, v in result.metrics.items()},
            "cohort_size": self.cohort_size,
            "clients_dropped": dropped,
            "dropped": dropped_note(self.cohort_size, result) if dropped else "",
            **self.privacy.algorithm.privacy_report(self.privacy.rounds, self.privacy.target_delta),
            **self.release_figures,
            **(extra or {}),
        }
        if self.audit is not None:
            row.update(self.audit.round_figures(self.model, state))
            self.recorder.update_privacy(**self.audit.summary)
        self.recorder.update_privacy(
            epsilon=row["epsilon"],
            local_epsilon=row["local_epsilon"],
            rounds_released=self.privacy.rounds,
            ledger=self.privacy.central.to_dict(),
        )
        self.recorder.log_round(row)
        self.display.row(row)
        self.save_checkpoint(server_round)

    def round_empty(self, server_round: int) -> None:
        """Record a round whose Poisson cohort is empty: nothing trained, released or accounted."""
        self.rounds_ended += 1
        row = {
            "server_round": server_round,
            "status": "empty",
            "message": "empty cohort: no client sampled",
            "round_time_s": 0.0,
            "epsilon": self.privacy.epsilon(),
            "cohort_size": 0,
        }
        self.recorder.log_round(row)
        self.display.row(row)
        self.save_checkpoint(server_round)

    def round_failed(self, server_round: int, error: RoundFailed, seconds: float) -> None:
        """Record a failed round (model unchanged, no release); abort if no client succeeded
        or ``round_failure=stop``."""
        self.rounds_ended += 1
        self.client_errors(server_round, error.errors)
        if self.round_failure is RoundFailure.STOP:
            raise RunFailed(self.stop_line(server_round, error.errors, None, str(error)))
        row = {
            "server_round": server_round,
            "status": "failed",
            "message": str(error),
            "round_time_s": seconds,
            "epsilon": self.privacy.epsilon(),
        }
        self.recorder.log_round(row)
        self.display.row(row)
        self.save_checkpoint(server_round)
        if error.num_ok == 0:
            raise RuntimeError(
                f"every client failed in round {server_round}; stopping the run: {error}"
            )

    def client_errors(self, server_round: int, errors: list[str]) -> None:
        """One line per failed client above the table (at most 10, then a count); every
        error with its traceback appended to the run's ``errors.log``."""
        if not errors:
            return
        for line in errors[:10]:
            self.display.note(f"  round {server_round}: {line.splitlines()[0]}")
        if len(errors) > 10:
            self.display.note(f"  round {server_round}: {len(errors) - 10} more in errors.log")
        with (self.recorder.out_dir / "errors.log").open("a") as log:
            log.writelines(f"round {server_round}: {e.rstrip()}\n" for e in errors)

    def stop_line(
        self,
        server_round: int,
        errors: list[str],
        result: AggregateResult | None,
        reason: str = "",
    ) -> str:
        """The one line ending a run under ``round_failure=stop``."""
        first = errors[0].splitlines()[0] if errors else ""
        if not first and result is not None:
            first = dropped_note(self.cohort_size, result)
        return (
            f"round {server_round}: {first or reason}; round_failure=stop ends the run "
            "(round_failure=drop accounts the round with the survivors' noise)"
        )


class RunFailed(RuntimeError):
    """The run ends with status ``failed`` (e.g. a client failed under ``round_failure=stop``)."""


def dropped_note(num_clients: int, result: AggregateResult) -> str:
    """``"1 client dropped: non-finite update"``: who is missing from the sum and why ('' if
    nobody); clients the aggregator did not name a reason for count as ``no reply``."""
    missing = num_clients - result.num_clients
    if missing <= 0:
        return ""
    reasons = {k: v for k, v in result.dropped.items() if v > 0}
    if missing > sum(reasons.values()):
        reasons["no reply"] = missing - sum(reasons.values())
    what = (
        next(iter(reasons))
        if len(reasons) == 1
        else ", ".join(f"{n} {reason}" for reason, n in reasons.items())
    )
    return f"{missing} client{'' if missing == 1 else 's'} dropped: {what}"


def prepare(cfg: DictConfig) -> tuple[dict[str, Any], Any]:
    """Validate everything and build the client algorithm (calibrating σ if asked).

    Returns the resolved config (with the calibrated ``privacy.noise_multiplier``) and the
    algorithm. Raises :class:`ConfigError` on any bad value, before anything is written.
    """
    validate(cfg)
    run_cfg = to_container(cfg)
    run_dataset(run_cfg)
    partitions(run_cfg)
    resolve_device(run_cfg)
    build_model_for(run_cfg)  # a bad model is refused before any output is written
    parse_enum(RoundFailure, "round_failure", run_cfg.get("round_failure", "drop"))
    algorithm = build_algorithm(run_cfg)
    check_audit(run_cfg, algorithm)
    p = run_cfg["privacy"]
    if p.get("target_epsilon") is not None:
        algorithm = algorithm.calibrated(
            float(p["target_epsilon"]), float(p["target_delta"]), int(run_cfg["num_rounds"])
        )
        run_cfg["privacy"] = {
            **p,
            **dict(algorithm.privacy),
            "calibrated_from_target_epsilon": p["target_epsilon"],
        }
    privacy = RunPrivacy(algorithm, run_cfg["privacy"])
    try:
        privacy.check()
    except ArithmeticError as exc:  # e.g. sigma=1e300: beyond double precision in the accountant
        sigma = run_cfg["privacy"].get("noise_multiplier")
        raise ConfigError(
            "privacy.noise_multiplier",
            sigma,
            f"is outside what the accountant can compute ({type(exc).__name__}: {exc}); "
            "use a realistic value",
        ) from None
    stop = run_cfg["privacy"].get("stop_at_epsilon")
    check(
        stop is None or not privacy.next_round_exceeds_budget(),
        "privacy.stop_at_epsilon",
        stop,
        "is below the epsilon of a single round: nothing could be trained",
    )
    check(
        run_cfg.get("vmap_clients") is not True
        or dense_chain(build_model_for(run_cfg)) is not None,
        "vmap_clients",
        True,
        f"needs a dense model (logistic, mlp: Linear and elementwise layers); "
        f"model={run_cfg['model']['name']} trains one client at a time (vmap_clients=null)",
    )
    agg_cls = aggregator_class(run_cfg["aggregator"])
    layout = run_layout(run_cfg)
    if layout.cohort.varies:
        check_varying_cohort(algorithm, layout.cohort)
    if getattr(agg_cls, "requires_integer_updates", False):
        check(
            algorithm.integer_updates,
            "aggregator",
            agg_cls.__name__,
            "needs a client algorithm that sends integers "
            f"({type(algorithm).__name__} sends floats): use client="
            + ("client_level_skellam" if algorithm.privacy_unit == "client" else "skellam_dpsgd"),
        )
        check(
            run_cfg["aggregator"].get("bits") == algorithm.bits,
            "aggregator.bits",
            run_cfg["aggregator"].get("bits"),
            f"must equal client.bits={algorithm.bits}",
        )
    return run_cfg, algorithm


def secure_mode_warning(algorithm: Any, privacy: dict[str, Any]) -> str:
    """The warning for ``privacy.secure_mode=true`` with noise not hardened against
    floating-point attacks (``""`` when hardened, not in secure mode, or σ = 0: no noise).
    secure_mode still draws all randomness (check-ins, sampling, noise) from OS entropy."""
    sigma = privacy.get("noise_multiplier")
    if not privacy.get("secure_mode") or (sigma is not None and float(sigma) == 0):
        return ""
    if getattr(algorithm, "hardened_noise", False):
        return ""
    return (
        f"fedpriv: warning: privacy.secure_mode=true: {type(algorithm).__name__} draws float "
        "noise, not hardened against floating-point attacks (float_noise_hardened=false); "
        "hardened: client=client_level (the trusted aggregator's lattice discrete Gaussian), "
        "client=skellam_dpsgd, client=client_level_skellam (integer Skellam noise)"
    )


def run_layout(run_cfg: dict[str, Any]) -> Layout:
    """The run's :class:`~fedpriv.run.layout.Layout` from its aggregator's and strategy's classes.

    Raises
    ------
    ConfigError
        For a bad ``num_workers`` or client sampling (:func:`fedpriv.run.layout.plan_layout`).
    """
    from hydra.utils import get_class

    agg_cls = aggregator_class(run_cfg["aggregator"])
    target = str((run_cfg.get("strategy") or {}).get("_target_") or "")
    try:
        virtual = bool(getattr(get_class(target), "virtual_clients", False))
    except Exception:  # the strategy's own import error is reported when it is built
        virtual = False
    secagg = bool(getattr(agg_cls, "uses_secagg_mods", False))
    return plan_layout(run_cfg, secagg=secagg, virtual_clients=virtual)


def check_varying_cohort(algorithm: Any, cohort: CohortSampler) -> None:
    """Refuse a Poisson cohort for an algorithm that cannot account every smaller sum (a
    Poisson cohort may hold a single client)."""
    try:
        for fewer in {1, max(1, cohort.nominal_size - 1)}:
            algorithm.degraded_round_events(fewer)
    except (NotImplementedError, ConfigError):
        raise ConfigError(
            "client_sampling",
            cohort.client_sampling.value,
            f"draws cohorts of varying size, and {type(algorithm).__name__} cannot account a "
            f"round with fewer than {cohort.nominal_size} clients: use "
            "client_sampling=fixed_size",
        ) from None


def noise_facts(algorithm: Any, privacy: dict[str, Any]) -> dict[str, Any]:
    """What protects the noise and what divides the release, for results.json and the header.

    ``noise_source``: ``seeded`` (reproducible from ``seed``: anyone holding the config can
    regenerate the noise and subtract it; right for a simulation, not for a deployment) or
    ``secure`` (OS entropy, ``privacy.secure_mode=true``). ``float_noise_hardened``: whether
    the noise resists floating-point attacks (the algorithm's ``hardened_noise``: integer
    Skellam noise does, float Gaussian noise does not). ``non_private``: no noise at all
    (``privacy.noise_multiplier=0``). ``normalizer``: the public constant dividing every
    released quantity (``privacy_summary()["normalizer"]``, else the algorithm's property;
    ``None`` if it states none).
    """
    source = NoiseSource.SECURE if privacy.get("secure_mode") else NoiseSource.SEEDED
    normalizer = algorithm.privacy_summary().get("normalizer")
    if normalizer is None:
        try:
            normalizer = float(algorithm.normalizer)
        except NotImplementedError:
            normalizer = None
    sigma = privacy.get("noise_multiplier")
    return {
        "noise_source": source.value,
        "float_noise_hardened": bool(getattr(algorithm, "hardened_noise", False)),
        "non_private": sigma is not None and float(sigma) == 0.0,
        "normalizer": normalizer,
    }


def clients_phrase(run_cfg: dict[str, Any], layout: Layout | None = None) -> str:
    """``"1000 clients (fixed_size cohort of 100) on 2 workers"`` for the header line."""
    n, cohort = run_cfg["num_clients"], (layout.cohort if layout else None)
    text = f"{n} clients"
    if cohort is not None and cohort.client_sampling.value == "poisson":
        text += f" (poisson cohort, rate {cohort.client_sample_rate:g})"
    elif cohort is not None and cohort.client_sampling.value == "fixed_size":
        text += f" (fixed_size cohort of {cohort.num_sampled_clients})"
    elif cohort is not None and cohort.client_sampling.value == "random_allocation":
        text += (
            f" (random allocation, {cohort.rounds_per_client} of every "
            f"{cohort.allocation_window} rounds)"
        )
    if layout is not None and not layout.one_node_per_client:
        text += f" on {layout.num_workers} worker{'s' if layout.num_workers > 1 else ''}"
    return text


def header_line(
    run_cfg: dict[str, Any],
    facts: dict[str, Any],
    analysis: str,
    out: Path,
    layout: Layout | None = None,
) -> str:
    """The run's first line: size, σ, δ, accounting, noise source, normalizer, outputs."""
    p = run_cfg["privacy"]
    sigma = p["noise_multiplier"]
    sigma_s = "None" if sigma is None else format(sigma, ".4g")
    norm = facts["normalizer"]
    norm_s = "unstated" if norm is None else format(norm, ".6g")
    hardened = "hardened" if facts["float_noise_hardened"] else "not hardened"
    return (
        ("NON-PRIVATE run (privacy.noise_multiplier=0): " if facts["non_private"] else "")
        + f"fedpriv: {clients_phrase(run_cfg, layout)}, {run_cfg['num_rounds']} rounds, "
        f"σ={sigma_s}, δ={p['target_delta']:g}, accounting={analysis}, "
        f"noise_source={facts['noise_source']} ({hardened} against floating-point attacks), "
        f"normalizer={norm_s}; outputs in {out}"
    )


def _instantiate(node: Any, group: str) -> Any:
    try:
        return instantiate(node, _convert_="all")
    except Exception as exc:  # Hydra wraps import and constructor errors
        raise build_error(group, node, exc) from None


def run_experiment(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
    """Run the configured experiment; write outputs into ``out_dir``; return the summary.

    Raises
    ------
    ConfigError
        On invalid configuration, before any output is written.
    """
    run_cfg, algorithm = prepare(cfg)
    aggregator = _instantiate(cfg.aggregator, "aggregator")
    if (
        run_cfg["round_failure"] == RoundFailure.DROP
        and getattr(aggregator, "min_replies", 0) is None
    ):
        aggregator.min_replies = 1  # the survivors are summed; Job.admit accounts them
    strategy = _instantiate(cfg.strategy, "strategy")
    if hasattr(strategy, "check_algorithm"):
        strategy.check_algorithm(algorithm)
    resumable = bool(getattr(strategy, "resumable", False))
    ckpt = None
    if run_cfg.get("resume"):  # fedpriv resume=RUN_DIR: continue in place (fedpriv.run.checkpoint)
        from fedpriv.run import checkpoint

        out_dir = Path(str(run_cfg["resume"]))
        check(
            resumable,
            "resume",
            str(out_dir),
            f"cannot be continued: strategy {type(strategy).__name__} writes no checkpoint "
            f"(resume supports {', '.join(checkpoint.RESUMABLE_STRATEGIES)})",
        )
        ckpt = checkpoint.load(out_dir)
    p = run_cfg["privacy"]
    analysis = RunPrivacy(algorithm, p).check().analysis
    backend = {
        "client_resources": dict(run_cfg["client_resources"]),
        "init_args": ray_init_args(run_cfg.get("ray_init_args")),
    }
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    from fedpriv.run.checkpoint import lock_run

    # one process at a time writes a run directory
    lock = lock_run(out_dir, "resume" if ckpt is not None else "hydra.run.dir")
    try:  # Ray before any output: its faults leave no results.json
        timeout = float(run_cfg["ray_connect_timeout_s"])
        start_ray(backend["init_args"], backend["client_resources"], timeout)
    except BaseException:
        lock.close()
        raise
    shared = share_run_dataset(run_cfg)  # one mapped copy of a large training set
    facts = noise_facts(algorithm, p)
    if warning := secure_mode_warning(algorithm, p):
        print(warning, file=sys.stderr)
    if facts["non_private"]:
        print(
            "fedpriv: warning: privacy.noise_multiplier=0 adds no noise: this run is NON-PRIVATE",
            file=sys.stderr,
        )
    (out_dir / "config_resolved.yaml").write_text(
        OmegaConf.to_yaml(OmegaConf.create({**run_cfg, "resume": None}))
    )
    saved = {} if ckpt is None else ckpt.meta
    recorder = RunRecorder(
        out_dir,
        privacy={
            "epsilon": 0.0,
            "delta": p["target_delta"],
            "accounting": analysis,
            "accountant": p["accountant"],
            "conversion": p["conversion"],
            "noise_multiplier": p["noise_multiplier"],
            "sample_rate": p["sample_rate"],
            "max_grad_norm": p["max_grad_norm"],
            "steps": getattr(algorithm, "steps", None),
            "num_rounds": run_cfg["num_rounds"],
            "num_clients": run_cfg["num_clients"],
            "client_sampling": run_cfg.get("client_sampling", "all"),
            "client_sample_rate": run_cfg.get("client_sample_rate"),
            "num_sampled_clients": run_cfg.get("num_sampled_clients"),
            **algorithm.privacy_summary(),
            **facts,
            **{
                k: saved["recorder_privacy"][k]
                for k in ("epsilon", "local_epsilon", "rounds_released", "ledger")
                if k in saved.get("recorder_privacy", {})
            },
        },
        extra={"config": run_cfg}
        | ({} if ckpt is None else {"resumed": [*saved.get("resumed", []), ckpt.round]}),
        resume_rounds=None if ckpt is None else list(saved.get("rows", [])),
    )
    display = RoundDisplay(int(run_cfg["num_rounds"]), enabled=bool(run_cfg.get("progress", True)))
    layout = run_layout(run_cfg)
    job = Job(run_cfg, algorithm, aggregator, recorder, display, layout)
    if job.audit is not None:
        recorder.update_privacy(**job.audit.summary)
    display.note(header_line(run_cfg, facts, analysis, out_dir, layout))
    if job.audit is not None:
        display.note(job.audit.header())
    if resumable:
        job.strategy, job.checkpoint_dir = strategy, out_dir
    if ckpt is None:
        job.save_checkpoint(0)
    else:
        from fedpriv.run import checkpoint

        job.restore(ckpt)
        display.note(
            f"resuming after round {ckpt.round} of {job.num_rounds} "
            f"(epsilon so far {job.privacy.epsilon():.4g})"
        )
        lost = checkpoint.lost_round(out_dir, ckpt) if job.secure else None
        if lost is not None:
            job.account_lost_round(lost)
        display.progress.update(display.task, completed=ckpt.round)  # the bar continues
    server_app = ServerApp()

    simulation_done = threading.Event()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            job.state = strategy.run(grid, job)
        finally:  # a timed-out client must not keep the finished run waiting
            release_stuck_clients(simulation_done)

    t0 = time.monotonic()
    status, message = "failed", ""
    try:
        with display, _graceful_stop(job):
            _run_simulation(server_app, make_client_app(run_cfg), layout.num_workers, backend)
            simulation_done.set()
        failed = sum(r.get("status") == "failed" for r in recorder.rounds)
        status = "stopped" if job.stop_reason else "complete"
        message = job.stop_reason or (f"{failed} round(s) failed" if failed else "")
    except BaseException as exc:
        message = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        _stop_ray()
        unshare(shared)
        recorder.extra["wall_time_s"] = job.wall_before + time.monotonic() - t0
        recorder.finish(
            status,
            message,
            weights=job.state if run_cfg.get("save_model", True) else None,
            plot=bool(run_cfg.get("plot", True)),
        )
        lock.close()
    return {
        "status": status,
        "exit_code": exit_code(status, job.stop_signal),
        "message": message,
        "rounds": recorder.rounds,
        "privacy": recorder.privacy,
        "wall_time_s": recorder.extra["wall_time_s"],
    }


def exit_code(status: str, stop_signal: int = 0) -> int:
    """The process exit code of a run that ended with ``status``: 0 only for ``complete``;
    a ``stopped`` run exits 128 + the signal that stopped it, or 3 (stopped by
    ``privacy.stop_at_epsilon``); ``failed`` exits 1 (a refused config exits 2)."""
    if status == "complete":
        return 0
    if status == "stopped":
        return 128 + stop_signal if stop_signal else 3
    return 1


# ray.init arguments that configure a NEW local instance (an existing cluster rejects them)
RAY_RESOURCE_ARGS = (
    "num_cpus",
    "num_gpus",
    "resources",
    "labels",
    "object_store_memory",
    "_memory",
    "_system_config",
    "_node_name",
    "_enable_object_reconstruction",
)


def ray_init_args(given: dict[str, Any] | None) -> dict[str, Any]:
    """``ray.init`` keyword arguments: the defaults, then ``given`` without null values.

    When ``address`` (or, if it is null, the ``RAY_ADDRESS`` environment variable) names an
    existing cluster (anything but ``"local"``), the resource-sizing arguments
    (:data:`RAY_RESOURCE_ARGS`) are dropped: Ray refuses them on connect, and the cluster's
    own resources apply.
    """
    args = {**DEFAULT_RAY_INIT, **{k: v for k, v in (given or {}).items() if v is not None}}
    if (args.get("address") or os.environ.get("RAY_ADDRESS") or "local") != "local":
        args = {k: v for k, v in args.items() if k not in RAY_RESOURCE_ARGS}
    return args


@contextlib.contextmanager
def _graceful_stop(job: Job) -> Iterator[None]:
    """First SIGINT/SIGTERM: finish the round in progress, save everything, stop (status
    ``stopped``, exit code 128 + the signal's number). A second one aborts at once
    (:class:`RunAborted`; the run is saved as ``failed``)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if job.interrupted:
            raise RunAborted(f"aborted by a second signal ({name}) during the run")
        job.interrupted, job.stop_signal = name, int(signum)
        job.display.note(f"{name}: stopping after this round (send it again to abort now)")

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


class RunAborted(KeyboardInterrupt):
    """A second SIGINT/SIGTERM: the run stops at once, saved with status ``failed``."""


def _stop_ray() -> None:
    """Shut the run's Ray instance down (its processes end with the run)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def _run_simulation(
    server_app: ServerApp, client_app: Any, num_nodes: int, backend: dict[str, Any]
) -> None:
    from flwr.simulation import run_simulation

    logging.getLogger("flwr").setLevel(logging.WARNING)
    quiet_known_notices()
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=num_nodes,
        backend_config=backend,
    )
