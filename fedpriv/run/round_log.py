"""What a run records of each round: the row, the ledgers, the checkpoint.

One :class:`RoundLog` per run. A released round is accounted (its contributors' noise: the
spec's degraded events when fewer than the nominal cohort) and its row written (``metrics.csv``,
``results.json``, the table); empty, failed and lost rounds get their own rows; the checkpoint
after every round holds the model, the strategy's state, the ledgers and the rows in one file
(:mod:`fedpriv.run.checkpoint`), so the model and the ledger that counts it belong together.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedpriv.report.display import RoundDisplay
from fedpriv.report.results import RunRecorder, json_safe
from fedpriv.run import checkpoint
from fedpriv.run.aggregation import AggregateResult, RoundFailed
from fedpriv.run.plan import RoundFailure
from fedpriv.run.run_privacy import RunPrivacy

#: The strategy's state for a checkpoint (``Strategy.checkpoint_state``).
StrategyState = Callable[[], dict[str, np.ndarray]]


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


class RoundLog:
    """Rows, ledgers and checkpoints of a run (see the module docstring).

    Parameters
    ----------
    privacy : RunPrivacy
        The run's ledgers.
    recorder : RunRecorder
        ``metrics.csv``, ``results.json``, ``model.npz``, ``curves.png``.
    display : RoundDisplay
        The table and progress bar.
    checkpoint_dir : Path or None
        Where checkpoints go (``None``: the strategy is not resumable).
    secure : bool
        ``privacy.secure_mode``: a round started but not saved counts as released on resume.
    """

    def __init__(
        self,
        privacy: RunPrivacy,
        recorder: RunRecorder,
        display: RoundDisplay,
        checkpoint_dir: Path | None,
        secure: bool,
    ) -> None:
        self.privacy = privacy
        self.recorder = recorder
        self.display = display
        self.checkpoint_dir = checkpoint_dir
        self.secure = secure
        self.strategy_state: StrategyState = dict
        self.stop_reason = ""
        self.lost_markers: list[str] = []
        self.wall_before = 0.0  # seconds run before the last resume
        self._t0 = time.monotonic()
        self._marker: tuple[int, str] = (0, "")  # (round, id) of round_started.json

    # ---- rows --------------------------------------------------------------------------
    def released(
        self,
        server_round: int,
        result: AggregateResult,
        cohort_size: int,
        metrics: dict[str, float],
        figures: dict[str, Any],
        seconds: float,
    ) -> None:
        """Account a released round (``result.num_clients`` contributors' noise) and write its
        row: the evaluation ``metrics``, ε, the clients dropped, the release's ``figures``."""
        self.privacy.record_round(result.num_clients, server_round)
        dropped = max(cohort_size - result.num_clients, 0)
        row = {
            "server_round": server_round,
            **metrics,
            "epsilon": self.privacy.epsilon(),
            "local_epsilon": self.privacy.local_epsilon(),
            "round_time_s": seconds,
            "status": "ok",
            "client_metrics": dict(result.metrics),
            "cohort_size": cohort_size,
            "clients_dropped": dropped,
            "dropped": dropped_note(cohort_size, result) if dropped else "",
            **self.privacy.spec.report(self.privacy.rounds),
            **figures,
        }
        self.update_privacy()
        self.write(row)

    def empty(self, server_round: int) -> None:
        """The row of a round whose Poisson cohort is empty (nothing released or accounted)."""
        self.write(
            {
                "server_round": server_round,
                "status": "empty",
                "message": "empty cohort: no client sampled",
                "round_time_s": 0.0,
                "epsilon": self.privacy.epsilon(),
                "cohort_size": 0,
            }
        )

    def failed(
        self, server_round: int, error: RoundFailed, seconds: float, policy: RoundFailure
    ) -> None:
        """The row of a failed round (model unchanged, no release).

        Raises
        ------
        RunFailed
            Under ``round_failure=stop``.
        """
        self.client_errors(server_round, error.errors)
        if policy is RoundFailure.STOP:
            raise RunFailed(self.stop_line(server_round, error.errors, None, reason=str(error)))
        self.write(
            {
                "server_round": server_round,
                "status": "failed",
                "message": str(error),
                "round_time_s": seconds,
                "epsilon": self.privacy.epsilon(),
            }
        )

    def lost(self, marker: dict[str, Any]) -> None:
        """Secure mode: count a round started after the last checkpoint as released (its redo
        draws new noise: a second release); whole-epoch events are composed again."""
        contributors = marker.get("contributors")
        self.privacy.record_round(None if contributors is None else int(contributors), 0)
        self.lost_markers.append(marker["id"])
        self.update_privacy()
        self.write(
            {
                "server_round": marker["round"],
                "status": "lost",
                "message": (
                    f"round {marker['round']} was started and not saved (process killed); "
                    "accounted as released: in secure_mode its redo is a new release"
                ),
                "round_time_s": 0.0,
                "epsilon": self.privacy.epsilon(),
            }
        )

    def account_aborted(self) -> None:
        """A round the server saw part of, then failed: accounted in full."""
        self.privacy.record_round()
        self.update_privacy(note="the last round aborted midway and is accounted in full")

    def write(self, row: dict[str, Any]) -> None:
        """Append ``row`` to the results and the table."""
        self.recorder.log_round(row)
        self.display.row(row)

    def update_privacy(self, **extra: Any) -> None:
        """ε, local ε, rounds and the ledger in ``results.json``'s privacy block."""
        self.recorder.update_privacy(
            epsilon=self.privacy.epsilon(),
            local_epsilon=self.privacy.local_epsilon(),
            rounds_released=self.privacy.rounds,
            ledger=self.privacy.ledger().to_dict(),
            **extra,
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
        cohort_size: int = 0,
        reason: str = "",
    ) -> str:
        """The one line ending a run under ``round_failure=stop``."""
        first = errors[0].splitlines()[0] if errors else ""
        if not first and result is not None:
            first = dropped_note(cohort_size, result)
        return (
            f"round {server_round}: {first or reason}; round_failure=stop ends the run "
            "(round_failure=drop accounts the round with the survivors' noise)"
        )

    # ---- checkpoints -------------------------------------------------------------------
    def mark_started(self, server_round: int, contributors: int | None = None) -> None:
        """Secure mode: ``round_started.json`` before a round's messages are sent (and with
        its contributors once the sum is admitted)."""
        if not self.secure or self.checkpoint_dir is None:
            return
        if self._marker[0] != server_round:  # a new attempt: a new id
            self._marker = (server_round, checkpoint.new_marker_id())
        checkpoint.mark_started(self.checkpoint_dir, server_round, self._marker[1], contributors)

    def save_checkpoint(
        self, server_round: int, state: dict[str, np.ndarray], round_config: dict[str, float]
    ) -> None:
        """Write the checkpoint after ``server_round`` (0: before the first round): model,
        strategy state, ledgers and rows in one atomic file."""
        if self.checkpoint_dir is None:
            return
        meta = {
            "privacy": self.privacy.state_dict(),
            "round_config": dict(round_config),
            "rows": self.recorder.rounds,
            "recorder_privacy": self.recorder.privacy,
            "lost_markers": self.lost_markers,
            "wall_time_s": self.wall_seconds(),
            "resumed": self.recorder.extra.get("resumed", []),
        }
        checkpoint.save(
            self.checkpoint_dir, server_round, state, self.strategy_state(), json_safe(meta)
        )

    def restore(self, meta: dict[str, Any]) -> dict[str, float]:
        """Restore the ledgers, lost markers and wall time of a checkpoint's ``meta``; returns
        its round config."""
        self.privacy.load_state_dict(meta["privacy"])
        self.lost_markers = list(meta.get("lost_markers", []))
        self.wall_before = float(meta.get("wall_time_s", 0.0))
        return {k: float(v) for k, v in meta.get("round_config", {}).items()}

    def wall_seconds(self) -> float:
        """Seconds of the whole run, earlier sessions before a resume included."""
        return self.wall_before + time.monotonic() - self._t0
