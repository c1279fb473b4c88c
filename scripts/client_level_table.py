"""Client-level DP-FedAvg on full Fashion-MNIST: accuracy at ε ≈ 1, 3, 8 for each sampler.

For every participation scheme (Poisson at q = 0.02, fixed-size cohorts of 120 without
replacement, random allocation of 1 round in each 50, Poisson with adaptive clipping) and every
target ε, the noise multiplier is calibrated to the target over the experiment's 500 rounds
(``privacy.target_epsilon``, each sampler's own analysis) and the experiment
``+experiment=client_level_fmnist`` is run through the Flower simulation. The Markdown table
gives the final test accuracy, the calibrated σ and the final ε of each run.

Usage::

    .venv/bin/python scripts/client_level_table.py --out outputs/client_level \\
        -- dataset.data_dir=../shared/data/fashion-mnist
    .venv/bin/python scripts/client_level_table.py --render outputs/client_level/runs.csv
    ... --samplers random_allocation --targets 3 8 --out outputs/client_level_b   # a part

Everything after ``--`` is passed to every run (e.g. ``num_rounds=50`` for a quick look).
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TARGETS = (1.0, 3.0, 8.0)
#: Hydra overrides of each participation scheme (the experiment itself is Poisson, q = 0.02).
SAMPLERS: dict[str, list[str]] = {
    "poisson": [],
    "fixed_size": [
        "client_sampling=fixed_size",
        "client_sample_rate=null",
        "num_sampled_clients=120",
        "privacy.accountant=rdp",
    ],
    "random_allocation": [
        "client_sampling=random_allocation",
        "client_sample_rate=null",
        "allocation_window=50",
        "rounds_per_client=1",
    ],
    "poisson_adaptive": [
        "client.target_unclipped_quantile=0.5",
        "privacy.count_noise_multiplier=6",
        "privacy.clipping_norm=0.3",
    ],
}
FIELDS = ("sampler", "target_epsilon", "status", "accuracy", "epsilon", "noise_multiplier", "s")


def run_one(out: Path, sampler: str, target: float, extra: list[str]) -> dict[str, Any]:
    """One calibrated run; its row (status ``failed`` with no numbers if it did not finish)."""
    run_dir = out / f"{sampler}-eps{target:g}"
    args = [
        "+experiment=client_level_fmnist",
        *SAMPLERS[sampler],
        "privacy.noise_multiplier=null",
        f"privacy.target_epsilon={target}",
        "progress=false",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "fedpriv.cli.experiment", *args], cwd=REPO, check=False
    )
    row: dict[str, Any] = {"sampler": sampler, "target_epsilon": target, "status": "failed"}
    results = run_dir / "results.json"
    if proc.returncode == 0 and results.exists():
        r = json.loads(results.read_text())
        row.update(
            status=r["status"],
            accuracy=r["rounds"][-1]["accuracy"],
            epsilon=r["privacy"]["epsilon"],
            noise_multiplier=r["privacy"]["noise_multiplier"],
        )
    row["s"] = round(time.monotonic() - t0, 1)
    return row


def render(rows: list[dict[str, Any]]) -> str:
    """Markdown: one line per sampler, accuracy (σ, final ε) per target."""
    head = "| sampler | " + " | ".join(f"ε ≈ {t:g}" for t in TARGETS) + " |"
    lines = [head, "|---" * (len(TARGETS) + 1) + "|"]
    for sampler in [x for x in SAMPLERS if any(r["sampler"] == x for r in rows)]:
        cells = []
        for t in TARGETS:
            r = next(
                (x for x in rows if x["sampler"] == sampler and float(x["target_epsilon"]) == t),
                None,
            )
            if r is None or r["status"] != "complete":
                cells.append("—")
                continue
            acc, sigma, eps = (float(r[k]) for k in ("accuracy", "noise_multiplier", "epsilon"))
            cells.append(f"{acc:.4f} (σ={sigma:.3f}, ε={eps:.3f})")
        lines.append(f"| {sampler} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "client_level")
    parser.add_argument("--samplers", nargs="*", default=list(SAMPLERS), choices=list(SAMPLERS))
    parser.add_argument("--targets", nargs="*", type=float, default=list(TARGETS))
    parser.add_argument("--render", type=Path, nargs="*", help="only print the table of runs.csv")
    args = parser.parse_args(own)
    if args.render:
        rows_read: list[dict[str, Any]] = []
        for path in args.render:
            with open(path) as f:
                rows_read += list(csv.DictReader(f))
        print(render(rows_read))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "runs.csv"
    rows: list[dict[str, Any]] = []
    for sampler in args.samplers:
        for target in args.targets:
            rows.append(run_one(args.out, sampler, target, extra))
            with open(path, "w", newline="") as f:  # rewritten after every run: nothing lost
                w = csv.DictWriter(f, FIELDS)
                w.writeheader()
                w.writerows(rows)
    table = render(rows)
    (args.out / "table.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
