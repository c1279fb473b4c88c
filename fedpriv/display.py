"""Console display of a run: a progress bar and one table row per server round."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

HEADER = f"{'round':>5}  {'accuracy':>8}  {'loss':>7}  {'ε':>8}  {'local ε':>9}  {'time [s]':>8}"


STANDARD = {"server_round", "accuracy", "loss", "epsilon", "local_epsilon", "round_time_s", "status", "message"}


def format_row(row: dict[str, Any]) -> str:
    """One aligned line of the per-round table."""
    if row.get("status", "ok") != "ok":
        return f"{row['server_round']:>5}  round failed: {row.get('message', '')}"
    local = row.get("local_epsilon")
    local_s = f"{local:9.3f}" if isinstance(local, float) else f"{'-':>9}"
    extra = "  ".join(f"{k}={v:.3g}" for k, v in row.items() if k not in STANDARD and isinstance(v, float))
    return (f"{row['server_round']:>5}  {row['accuracy']:8.4f}  {row['loss']:7.4f}  "
            f"{row['epsilon']:8.3f}  {local_s}  {row['round_time_s']:8.2f}  {extra}").rstrip()


class RoundDisplay:
    """Progress bar over rounds with the per-round table printed above it."""

    def __init__(self, num_rounds: int, enabled: bool = True) -> None:
        self.console = Console(highlight=False, markup=False)
        self.progress = Progress(
            TextColumn("[bold]rounds"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("eta"), TimeRemainingColumn(), console=self.console, transient=True,
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
        self.console.print(format_row(row))
        self.progress.advance(self.task)

    def note(self, text: str) -> None:
        self.console.print(text)
