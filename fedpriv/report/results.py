"""Run outputs: per-round ``metrics.csv``, ``results.json``, final weights, ``curves.png``.

Everything is written as the run goes: ``metrics.csv`` is appended and flushed every round
and ``results.json`` is replaced atomically with ``"status": "running"`` until the run ends
(``"complete"``, ``"stopped"`` or ``"failed"``), so a crashed or killed run keeps what it had
and never looks finished.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

ROUND_FIELDS = (
    "server_round",
    "accuracy",
    "loss",
    "epsilon",
    "local_epsilon",
    "round_time_s",
    "status",
)


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "inf" / "nan": JSON has no literal for them
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _fields_of(first: dict[str, Any]) -> list[str]:
    """``metrics.csv`` columns: :data:`ROUND_FIELDS`, then the first row's other scalars."""
    extra = [k for k, v in first.items() if k not in ROUND_FIELDS and isinstance(v, (int, float))]
    return [*ROUND_FIELDS, *extra]


class RunRecorder:
    """Writes a run's outputs into ``out_dir`` as the run progresses.

    Parameters
    ----------
    out_dir : Path
        The run directory (Hydra's run dir when launched from the CLI).
    privacy : dict
        The ``privacy`` block of ``results.json`` (epsilon, delta, accountant, ...).
    extra : dict
        Other top-level keys for ``results.json`` (e.g. the experiment summary).
    resume_rounds : list of dict, optional
        Resume mode (``fedpriv resume=RUN_DIR``): the rows of the rounds already done (from the
        checkpoint). ``metrics.csv`` is rewritten from them atomically (dropping any row
        written after the checkpoint) and the next rounds are appended; ``None`` (a new run)
        starts a new ``metrics.csv``.
    """

    def __init__(
        self,
        out_dir: Path,
        privacy: dict[str, Any],
        extra: dict[str, Any] | None = None,
        resume_rounds: list[dict[str, Any]] | None = None,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.privacy = dict(privacy)
        self.extra = dict(extra or {})
        self.rounds: list[dict[str, Any]] = []
        self.status = "running"
        self.message = ""
        self._csv = self.out_dir / "metrics.csv"
        self._fields: list[str] = list(ROUND_FIELDS)
        if resume_rounds is None:
            self._csv.unlink(missing_ok=True)
        else:
            self._rewrite_csv(resume_rounds)
        self._write_json()

    def _rewrite_csv(self, rows: list[dict[str, Any]]) -> None:
        """Resume mode: ``metrics.csv`` holds exactly ``rows`` under its existing header
        (written to a temp file, renamed)."""
        self.rounds = [dict(r) for r in rows]
        if not rows:
            self._csv.unlink(missing_ok=True)
            return
        self._fields = _fields_of(rows[0])
        try:  # the run's own header (the first row's figures as they were, before JSON)
            with self._csv.open(newline="") as f:
                header = next(csv.reader(f), [])
            if header[: len(ROUND_FIELDS)] == list(ROUND_FIELDS):
                self._fields = header
        except OSError:
            pass
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=self._fields, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row.get(k, "") for k in self._fields})
        atomic_write_text(self._csv, buf.getvalue())

    def log_round(self, row: dict[str, Any]) -> None:
        """Append one round (keys of :data:`ROUND_FIELDS`, extra keys kept in JSON only)."""
        self.rounds.append(dict(row))
        new = not self._csv.exists()
        if new:  # the header: standard fields, then the first row's extra scalar figures
            self._fields = _fields_of(row)
        with self._csv.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self._fields, extrasaction="ignore")
            if new:
                writer.writeheader()
            writer.writerow({k: row.get(k, "") for k in self._fields})
        self._write_json()

    def update_privacy(self, **values: Any) -> None:
        self.privacy.update(values)
        self._write_json()

    def finish(
        self,
        status: str,
        message: str = "",
        weights: dict[str, np.ndarray] | None = None,
        plot: bool = True,
    ) -> None:
        """Mark the run ended; save the weights (``model.npz``) and ``curves.png``."""
        if weights is not None:
            np.savez_compressed(self.out_dir / "model.npz", allow_pickle=False, **weights)
        if plot and self.rounds:
            from fedpriv.report.plots import plot_curves

            plot_curves(self.rounds, self.out_dir / "curves.png")
        self.status, self.message = status, message
        self._write_json()

    def _write_json(self) -> None:
        doc = {
            "status": self.status,
            "message": self.message,
            "rounds": self.rounds,
            "privacy": self.privacy,
            **self.extra,
        }
        atomic_write_text(self.out_dir / "results.json", json.dumps(json_safe(doc), indent=2))
