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
    .venv/bin/python scripts/secagg_local_steps_table.py --bits 32 20 16 14 12 \
        --out outputs/secagg_bits -- dataset.data_dir=../shared/data/fashion-mnist \
        client.signal_growth=sqrt          # issue 26: bits against accuracy, table and plot

With ``--bits`` every (seed, variant) runs once per width (``client.bits``); the table then has
a line per variant and width with the bits each client sends per round and the coordinates
that wrapped (measured by the ideal aggregator), and ``bits.png`` plots accuracy against bits.

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
    "bits",
    "bits_per_round",
    "wrapped_coordinates",
    "coordinates_summed",
    "wrap_bound",
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
    coords = int(priv.get("coordinates") or 0)
    return {
        "bits": priv.get("bits"),
        "bits_per_round": int(priv.get("bits") or 0) * coords,
        "wrapped_coordinates": int(sum(r.get("wrapped_coordinates", 0) for r in ok)),
        "coordinates_summed": coords * len(ok),
        "wrap_bound": priv.get("wrap_bound"),
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


def growth_of(row: dict[str, Any]) -> str:
    """The run's ``client.signal_growth`` (from its overrides; the default is linear)."""
    found = [o.split("=", 1)[1] for o in row["overrides"].split() if "signal_growth=" in o]
    return found[-1] if found else "linear"


def bits_series(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """The (variant, signal growth) pairs of a ``--bits`` sweep, in a stable order."""
    keys = {(r["variant"], growth_of(r)) for r in rows}
    return sorted(keys, key=lambda k: (VARIANTS.index(k[0]), k[1]))


def format_bits_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown table of a ``--bits`` sweep: a line per variant and width, accuracy mean ±
    SEM over seeds, ε, σ, bits each client sends per round, measured wrap rate and its bound."""
    lines = [
        "| variant | signal growth | bits | σ (sum) | ε | test accuracy (mean ± SEM) | seeds "
        "| bits sent / client / round | wrapped coordinates (rate) | wrap bound |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for v, growth in bits_series(rows):
        series = [r for r in rows if r["variant"] == v and growth_of(r) == growth]
        for b in sorted({int(r["bits"]) for r in series}, reverse=True):
            sel = [r for r in series if int(r["bits"]) == b and r["status"] == "complete"]
            if not sel:
                continue
            acc, sem = mean_sem([100 * float(r["accuracy"]) for r in sel])
            wraps = sum(int(r["wrapped_coordinates"]) for r in sel)
            rate = wraps / max(1, sum(int(r["coordinates_summed"]) for r in sel))
            lines.append(
                f"| {v} | {growth} | {b} | {float(sel[0]['noise_multiplier']):.3f} "
                f"| {max(float(r['epsilon']) for r in sel):.3f} | {acc:.1f} ± {sem:.1f} "
                f"| {len(sel)} | {int(sel[0]['bits_per_round']):,} | {wraps} ({rate:.2g}) "
                f"| {float(sel[0]['wrap_bound']):.3g} |"
            )
    return "\n".join(lines)


def plot_bits(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Accuracy (mean ± SEM over seeds) against ``bits``, one line per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.4))
    for v, growth in bits_series(rows):
        done = [r for r in rows if r["variant"] == v and growth_of(r) == growth]
        done = [r for r in done if r["status"] == "complete"]
        widths = sorted({int(r["bits"]) for r in done})
        stats = [
            mean_sem([100 * float(r["accuracy"]) for r in done if int(r["bits"]) == b])
            for b in widths
        ]
        if widths:
            label = f"{v}, signal_growth={growth}"
            ax.errorbar(
                widths,
                [m for m, _ in stats],
                [e for _, e in stats],
                marker="o",
                label=label,
                capsize=3,
            )
    ax.set_xlabel("bits per coordinate (secure sum modulo 2^bits)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Skellam + secure sum at ε = 1: accuracy against bits")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a runs.csv written by :func:`main`."""
    with path.open() as f:
        return list(csv.DictReader(f))


def sweep(
    seeds: Sequence[int], variants: Sequence[str], widths: Sequence[int] | None
) -> list[tuple[int, str, int | None]]:
    """The runs, seed-major (an interrupted sweep still has paired variants and widths)."""
    bits: list[int | None] = list(widths) if widths else [None]
    return [(s, v, b) for s in seeds for v in variants for b in bits]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--experiment", choices=sorted(STEP_VARIANTS), default="secagg_fmnist_local_steps"
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--out", type=Path, default=Path("outputs/secagg_local_steps"))
    ap.add_argument("--render", type=Path, help="only print the table of a saved runs.csv")
    ap.add_argument("--bits", type=int, nargs="+", help="run each variant at these client.bits")
    ap.add_argument("--plot", type=Path, help="with --render of a --bits sweep: write the plot")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run (after --)")
    args = ap.parse_args(argv)
    if args.render:
        rows = read_rows(args.render)
        bits_sweep = any(r.get("bits") for r in rows) and len({r["bits"] for r in rows}) > 1
        print(format_bits_table(rows) if bits_sweep else format_table(rows))
        if bits_sweep and args.plot:
            plot_bits(rows, args.plot)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / "runs.csv"
    rows = read_rows(csv_path) if csv_path.exists() else []
    with csv_path.open("a", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        if not rows:
            writer.writeheader()
        for seed, v, bits in sweep(args.seeds, args.variants, args.bits):
            ov = [
                f"seed={seed}",
                "progress=false",
                "plot=false",
                *variant_overrides(args.experiment, v),
                *([f"client.bits={bits}"] if bits else []),
                *args.overrides,
            ]
            name = f"{v.replace(' ', '_')}_seed{seed}" + (f"_bits{bits}" if bits else "")
            if any(r["overrides"] == " ".join(ov) for r in rows):
                continue  # done in an earlier, interrupted sweep
            row = {
                "experiment": args.experiment,
                "variant": v,
                "seed": seed,
                "overrides": " ".join(ov),
                **run_one(args.experiment, ov, args.out / name),
            }
            writer.writerow(row)
            f.flush()
            rows.append(row)
            print(
                {k: row[k] for k in ("variant", "seed", "accuracy", "epsilon", "wall_time_s")},
                flush=True,
            )
    table = format_bits_table(rows) if args.bits else format_table(rows)
    print(table)
    (args.out / "table.md").write_text(table + "\n")
    if args.bits:
        plot_bits(rows, args.out / "bits.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
