"""Run the random check-in experiments and print the table of docs/checkin.md (markdown).

Usage (from the repository root)::

    python scripts/checkin_table.py                 # run every row, then print the table
    python scripts/checkin_table.py --reuse         # only read outputs/checkin_table/*/results.json
    python scripts/checkin_table.py --only fixed-e1 # run one row

Each row is one ``fedpriv +experiment=...`` command (printed with the table), run into
``outputs/checkin_table/<row>``. Columns: test accuracy after the run, central epsilon at the
run's delta (the engine's theorem for the variant, composed over passes), each client's local
eps0, dummy updates (fixed, sliding) or skipped slots (averaged, poisson) against the paper's
expectation, updates used, and the measured per-slot time of the slot phase.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "outputs" / "checkin_table"

ROWS: dict[str, list[str]] = {
    "fixed-e1": ["+experiment=checkin_adult", "client.variant=fixed", "privacy.local_epsilon=1"],
    "averaged-e1": [
        "+experiment=checkin_adult",
        "client.variant=averaged",
        "privacy.local_epsilon=1",
    ],
    "poisson-e1": [
        "+experiment=checkin_adult",
        "client.variant=poisson",
        "privacy.local_epsilon=1",
    ],
    "fixed-e2": ["+experiment=checkin_adult", "client.variant=fixed", "privacy.local_epsilon=2"],
    "averaged-e2": [
        "+experiment=checkin_adult",
        "client.variant=averaged",
        "privacy.local_epsilon=2",
    ],
    "poisson-e2": [
        "+experiment=checkin_adult",
        "client.variant=poisson",
        "privacy.local_epsilon=2",
    ],
    "sliding-fmnist": ["+experiment=checkin_sliding_window"],
}


def command(row: str) -> list[str]:
    """The ``fedpriv`` command line of a row."""
    return ["fedpriv", *ROWS[row], "progress=false", f"hydra.run.dir={OUT / row}"]


def run(row: str) -> None:
    """Run one row with the project's CLI (same interpreter)."""
    args = [sys.executable, "-m", "fedpriv.cli.experiment", *command(row)[1:]]
    subprocess.run(args, cwd=REPO, check=True)


def table_row(row: str) -> str | None:
    """The markdown line of a finished row, or ``None`` if it has no results."""
    path = OUT / row / "results.json"
    if not path.is_file():
        return None
    res = json.loads(path.read_text())
    last = [r for r in res["rounds"] if r.get("status") == "ok"][-1]
    cfg = res["config"]
    if "dummies" in last:
        empty = f"{last['dummies']:.0f} dummies (exp. {last['expected_dummies']:.1f})"
    else:
        empty = f"{last['skipped']:.0f} skipped (exp. {last['expected_skipped']:.1f})"
    # which bound answered (the theorem or the local eps0 cap), recorded by the run
    bound = res["privacy"].get("bound", "")
    return (
        f"| {cfg['dataset']['name']} | {cfg['client']['variant']} | {cfg['num_clients']} | "
        f"{cfg['client']['num_slots']} | {cfg['privacy']['local_epsilon']:g} | "
        f"{last['accuracy']:.4f} | {float(res['privacy']['epsilon']):.3f} | {bound} | {empty} | "
        f"{last['updates_used']:.0f} | {last['slot_ms']:.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--reuse", action="store_true", help="do not run, only read existing results"
    )
    parser.add_argument(
        "--only", nargs="*", choices=sorted(ROWS), help="rows to run (default: all)"
    )
    args = parser.parse_args()
    rows = args.only or list(ROWS)
    if not args.reuse:
        for row in rows:
            run(row)
    print(
        "| data | variant | n | m | eps0 | test acc. | central eps (delta=1e-6) | bound "
        "| empty slots | updates | ms/slot |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        line = table_row(row)
        if line:
            print(line)
    print()
    for row in rows:
        print("    " + " ".join(shlex.quote(a) for a in command(row)[:-1]))


if __name__ == "__main__":
    main()
