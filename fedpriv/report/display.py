"""Console display of a run: a progress bar and one table row per server round.

Rows are printed without hard wrapping (a long row wraps where the terminal wraps it, and a
piped log keeps one line per round); every figure is also in ``metrics.csv``.
"""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from fedpriv.report.results import ROUND_FIELDS

HEADER = f"{'round':>5}  {'accuracy':>8}  {'loss':>8}  {'ε':>8}  {'local ε':>9}  {'time [s]':>8}"


STANDARD = {*ROUND_FIELDS, "message", "clients_dropped", "dropped"}


GROUP_EPS = re.compile(r"epsilon_g(\d+)$")


def fixed(value: float, width: int, decimals: int) -> str:
    """``value`` right-aligned in ``width`` characters: fixed-point while it fits, else 3 digits."""
    text = f"{value:{width}.{decimals}f}"
    return text if len(text) <= width else f"{value:{width}.3g}"


def group_epsilons(row: dict[str, Any]) -> str:
    """``ε g=1,2,4,8: 1.99/2.91/4.24/5.95 (closed form 1.99/2.94/4.38/6.57)`` from the
    ``epsilon_g{g}`` and ``epsilon_g{g}_closed`` keys of ``row`` ('' if there are none)."""
    groups = sorted(int(m.group(1)) for k in row if (m := GROUP_EPS.match(k)))
    if not groups:
        return ""
    text = f"ε g={','.join(map(str, groups))}: " + "/".join(
        f"{row[f'epsilon_g{g}']:.3g}" for g in groups
    )
    closed = [row.get(f"epsilon_g{g}_closed") for g in groups]
    if all(isinstance(c, float) for c in closed):
        text += " (closed form " + "/".join(f"{c:.3g}" for c in closed) + ")"
    return text


def format_row(row: dict[str, Any]) -> str:
    """One aligned line of the per-round table (group ε condensed, other extras as key=value)."""
    if row.get("status", "ok") != "ok":
        what = "lost" if row.get("status") == "lost" else "failed"  # lost: fedpriv.run.checkpoint
        return f"{row['server_round']:>5}  round {what}: {row.get('message', '')}"
    local = row.get("local_epsilon")
    local_s = fixed(local, 9, 3) if isinstance(local, float) else f"{'-':>9}"
    extra = [
        f"{k}={v:.3g}"
        for k, v in row.items()
        if k not in STANDARD and isinstance(v, float) and not k.startswith("epsilon_g")
    ]
    extra.append(group_epsilons(row))
    extra.append(str(row.get("dropped") or ""))  # e.g. "1 client dropped: non-finite update"
    return (
        f"{row['server_round']:>5}  {fixed(row['accuracy'], 8, 4)}  {fixed(row['loss'], 8, 4)}  "
        f"{fixed(row['epsilon'], 8, 3)}  {local_s}  {fixed(row['round_time_s'], 8, 2)}  "
        + "  ".join(e for e in extra if e)
    ).rstrip()


class RoundDisplay:
    """Progress bar over rounds with the per-round table printed above it."""

    def __init__(self, num_rounds: int, enabled: bool = True) -> None:
        self.console = Console(highlight=False, markup=False)
        self.progress = Progress(
            TextColumn("[bold]rounds"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
            disable=not enabled,
        )
        self.task = self.progress.add_task("rounds", total=num_rounds)

    def __enter__(self) -> RoundDisplay:
        self.progress.start()
        self.console.print(HEADER)
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def row(self, row: dict[str, Any]) -> None:
        self.console.print(format_row(row), soft_wrap=True)
        self.progress.advance(self.task)

    def note(self, text: str) -> None:
        self.console.print(text, soft_wrap=True)
