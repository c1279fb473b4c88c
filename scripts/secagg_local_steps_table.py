"""1 local step vs 1 local epoch per round under secure aggregation at fixed ε: the table.

Heikkilä, "On Using Secure Aggregation in Differentially Private Federated Learning with
Multiple Local Steps" (Section 5, Figure 1 and the ACS Income experiment):
at a fixed privacy budget (the noise is calibrated to ``privacy.target_epsilon`` for each
variant) and a fixed number of FL rounds, clients that run one local epoch per round end with a
better model than clients that run one local step. This driver runs both variants of an
experiment config for several seeds through the Flower simulation and writes the per-run CSV
and a Markdown table (final test accuracy, mean ± SEM over seeds, and the epoch − step gap).

Usage::

    .venv/bin/python scripts/secagg_local_steps_table.py --experiment secagg_fmnist_local_steps \
        --seeds 0 1 2 --out outputs/secagg_fmnist -- dataset.data_dir=../shared/data/fashion-mnist
    .venv/bin/python scripts/secagg_local_steps_table.py --experiment secagg_acs_income \
        --seeds 0 1 2 --out outputs/secagg_acs
    .venv/bin/python scripts/secagg_local_steps_table.py --render outputs/secagg_fmnist/runs.csv

Everything after ``--`` is passed as Hydra overrides to every run (e.g. a reduced setting:
``dataset=fashion_mnist_embedded num_rounds=10``).
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir

from fedpriv.run.config import conf_dir, register_schema
from fedpriv.run.runner import run_experiment

#: Hydra overrides of the "1 local step" variant of each experiment; "1 local epoch" is the
#: experiment config itself. Fashion-MNIST: expected batch 128 of a client's 6,000 rows
#: (Appendix A.6) and lr 2.0 (the epoch variant's 0.5 is picked per variant, see
#: docs/secagg-experiments.md); ACS Income: the same q = 0.05 as the epoch variant (Appendix A.6).
STEP_VARIANTS: dict[str, list[str]] = {
    "secagg_fmnist_local_steps": [
        "client.steps=1",
        f"privacy.sample_rate={128 / 6000!r}",
        "client.lr=2.0",
    ],
    "secagg_acs_income": ["client.steps=1"],
}
VARIANTS = ("1 step", "1 epoch")
FIELDS = (
    "experiment",
    "variant",
    "seed",
    "status",
    "accuracy",
    "loss",
    "epsilon",
    "local_epsilon",
    "noise_multiplier",
    "steps",
    "sample_rate",
    "rounds",
    "wall_time_s",
    "overrides",
)


def variant_overrides(experiment: str, variant: str) -> list[str]:
    """Hydra overrides (after ``+experiment=...``) of ``variant`` in ``VARIANTS``.

    Raises
    ------
    ValueError
        For an unknown experiment or variant.
    """
    if experiment not in STEP_VARIANTS:
        raise ValueError(f"experiment={experiment!r} must be one of {sorted(STEP_VARIANTS)}")
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r} must be one of {VARIANTS}")
    return list(STEP_VARIANTS[experiment]) if variant == "1 step" else []


def run_one(experiment: str, overrides: list[str], out_dir: Path) -> dict[str, Any]:
    """Run one configuration through the Flower simulation; return its CSV row (no id fields)."""
    register_schema()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"+experiment={experiment}", *overrides])
    t0 = time.monotonic()
    summary = run_experiment(cfg, out_dir)
    wall = time.monotonic() - t0
    ok = [r for r in summary["rounds"] if r.get("status") == "ok"]
    last = ok[-1] if ok else {}
    priv = summary["privacy"]
    return {
        "status": summary["status"],
        "accuracy": last.get("accuracy", math.nan),
        "loss": last.get("loss", math.nan),
        "epsilon": last.get("epsilon", math.nan),
        "local_epsilon": last.get("local_epsilon", math.nan),
        "noise_multiplier": priv.get("noise_multiplier"),
        "steps": priv.get("steps"),
        "sample_rate": priv.get("sample_rate"),
        "rounds": len(ok),
        "wall_time_s": round(wall, 1),
    }


def mean_sem(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (sample std / √n; 0 for a single value)."""
    m = statistics.fmean(values)
    return m, (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0)


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown table: one line per variant (accuracy mean ± SEM in points) and the gap."""
    lines = [
        "| variant | steps/round | q | σ (sum) | ε | local ε | test accuracy (mean ± SEM) "
        "| seeds | wall time/run |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    means: dict[str, float] = {}
    for v in VARIANTS:
        sel = [r for r in rows if r["variant"] == v and r["status"] == "complete"]
        if not sel:
            continue
        acc, sem = mean_sem([100 * float(r["accuracy"]) for r in sel])
        means[v] = acc
        r0 = sel[0]
        lines.append(
            f"| {v} | {r0['steps']} | {float(r0['sample_rate']):.4g} "
            f"| {float(r0['noise_multiplier']):.3f} | "
            f"{max(float(r['epsilon']) for r in sel):.3f} "
            f"| {max(float(r['local_epsilon']) for r in sel):.2f} | "
            f"{acc:.1f} ± {sem:.1f} | {len(sel)} "
            f"| {statistics.fmean(float(r['wall_time_s']) for r in sel):.0f} s |"
        )
    if len(means) == 2:
        lines.append(f"\n1 epoch − 1 step: **{means['1 epoch'] - means['1 step']:+.1f} points**")
    return "\n".join(lines)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a runs.csv written by :func:`main`."""
    with path.open() as f:
        return list(csv.DictReader(f))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--experiment", choices=sorted(STEP_VARIANTS), default="secagg_fmnist_local_steps"
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--out", type=Path, default=Path("outputs/secagg_local_steps"))
    ap.add_argument("--render", type=Path, help="only print the table of a saved runs.csv")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run (after --)")
    args = ap.parse_args(argv)
    if args.render:
        print(format_table(read_rows(args.render)))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / "runs.csv"
    rows = read_rows(csv_path) if csv_path.exists() else []
    with csv_path.open("a", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        if not rows:
            writer.writeheader()
        for seed in args.seeds:  # seed-major: an interrupted sweep still has paired variants
            for v in args.variants:
                ov = [
                    f"seed={seed}",
                    "progress=false",
                    "plot=false",
                    *variant_overrides(args.experiment, v),
                    *args.overrides,
                ]
                row = {
                    "experiment": args.experiment,
                    "variant": v,
                    "seed": seed,
                    "overrides": " ".join(ov),
                    **run_one(args.experiment, ov, args.out / f"{v.replace(' ', '_')}_seed{seed}"),
                }
                writer.writerow(row)
                f.flush()
                rows.append(row)
                print(
                    {k: row[k] for k in ("variant", "seed", "accuracy", "epsilon", "wall_time_s")},
                    flush=True,
                )
    table = format_table(rows)
    print(table)
    (args.out / "table.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
