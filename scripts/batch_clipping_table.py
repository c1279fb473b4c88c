"""Batch clipping + shuffling vs individual clipping + subsampling: the side-by-side table.

Runs the ``batch_clipping_vs_dpsgd`` experiment (van Dijk et al., "Generalizing DP-SGD with
Shuffling and Batch Clipping", arXiv:2212.05796; MNIST 10k/10k, sigma = 2) for
(a) batch clipping with shuffling and (b) individual clipping with subsampling, with the same
epochs and batch size, for each number of clients asked, through the Flower simulation, and
prints/saves test accuracy, epsilon at delta = 1e-5 for groups of g = 1, 2, 4, 8 records (the
exact f-DP mixture, with the paper's Table 1 closed form), and wall time.

Usage::

    .venv/bin/python scripts/batch_clipping_table.py --out outputs/batch_clipping_table \
        [--clients 1 10] [--batch 64] [--lr-a 0.0003 0.005] [--lr-b 0.03 0.5] \
        [-- extra hydra overrides]

``--lr-a`` / ``--lr-b`` give one step size per ``--clients`` entry (or one for all); by default
the tuned ones of :data:`TUNED_LR`. Every run is validated before the first one trains; the
table files are rewritten after each run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedpriv.accounting.accountants.gdp import gdp_mu
from fedpriv.common.errors import ConfigError, check
from fedpriv.run.config import compose_config
from fedpriv.run.prepare import prepare
from fedpriv.run.runner import run_experiment

GROUPS = (1, 2, 4, 8)


def variant_overrides(variant: str, batch: int, lr: float) -> list[str]:
    """Hydra overrides of variant ``a`` (batch clipping + shuffling) or ``b`` (individual +
    subsampling)."""
    if variant == "a":
        return [
            "client=batch_clipping",
            "client.sampler=shuffle",
            "client.num_groups=1",
            f"client.group_size={batch}",
            f"client.lr={lr}",
        ]
    return [
        "client=individual_clipping",
        "client.sampler=subsample",
        f"client.num_groups={batch}",
        "client.group_size=1",
        f"client.lr={lr}",
    ]


def compose_variant(overrides: list[str]) -> Any:
    """The experiment's config with ``overrides`` (a Hydra DictConfig)."""
    return compose_config(["+experiment=batch_clipping_vs_dpsgd", *overrides])


def run_variant(overrides: list[str], out_dir: Path) -> dict[str, Any]:
    """Run one configuration; return its table row."""
    cfg = compose_variant(overrides)
    t0 = time.monotonic()
    summary = run_experiment(cfg, out_dir)
    wall = time.monotonic() - t0
    last = [r for r in summary["rounds"] if r.get("status") == "ok"][-1]
    row: dict[str, Any] = {
        "accuracy": last["accuracy"],
        "epsilon": last["epsilon"],
        "wall_time_s": wall,
        "rounds": last["server_round"],
        "status": summary["status"],
    }
    for g in GROUPS:
        row[f"epsilon_g{g}"] = last.get(f"epsilon_g{g}")
        row[f"epsilon_g{g}_closed"] = last.get(f"epsilon_g{g}_closed")
    return row


def format_table(rows: Sequence[dict[str, Any]], target_delta: float = 1e-5) -> str:
    """Markdown table: one line per (clients, variant).

    ``μ-equiv. g=8/g=1`` is the ratio of the GDP parameters with the same ε at ``target_delta``
    (``gdp_mu``): ≈ √8 = 2.83 for a √g law, 8 for a linear one.
    """
    head = (
        "| clients | variant | test acc. | "
        + " | ".join(f"ε g={g}" for g in GROUPS)
        + " | μ-equiv. g=8/g=1 | Table 1 closed form ε g=1 / g=8 | wall time |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        eps = [r[f"epsilon_g{g}"] for g in GROUPS]
        ratio = gdp_mu(eps[-1], target_delta) / gdp_mu(eps[0], target_delta)
        lines.append(
            f"| {r['clients']} | {r['variant']} | {100 * r['accuracy']:.1f}% | "
            + " | ".join(f"{e:.2f}" for e in eps)
            + f" | {ratio:.2f} | {r['epsilon_g1_closed']:.2f} / {r['epsilon_g8_closed']:.2f}"
            + f" | {r['wall_time_s']:.0f} s |"
        )
    return "\n".join(lines)


NAMES = {"a": "(a) batch clipping + shuffling", "b": "(b) individual clipping + subsampling"}


# Step sizes tuned per number of clients (docs/batch-clipping.md): clients -> (lr of (a), lr of (b))
TUNED_LR = {1: (0.0003, 0.03), 10: (0.005, 0.5)}


def per_clients(values: list[float] | None, clients: list[int], variant: str) -> list[float]:
    """One step size of ``variant`` per ``--clients`` entry: ``values``, its single value
    repeated, or (``None``) the tuned one of each client count.

    Raises
    ------
    ConfigError
        Naming ``--lr-{variant}`` for a wrong count, or a client count with no tuned value.
    """
    flag = f"--lr-{variant}"
    if values is None:
        untuned = [n for n in clients if n not in TUNED_LR]
        check(
            not untuned,
            "--clients",
            untuned,
            f"have no tuned step sizes (tuned: {sorted(TUNED_LR)}); give {flag} "
            f"(and --lr-{'b' if variant == 'a' else 'a'})",
        )
        return [TUNED_LR[n][variant == "b"] for n in clients]
    check(
        len(values) in (1, len(clients)),
        flag,
        values,
        f"must give one value or one per --clients entry ({len(clients)})",
    )
    return values * len(clients) if len(values) == 1 else values


def plan(args: argparse.Namespace) -> list[tuple[int, str, list[str]]]:
    """Every run's (clients, variant, overrides), each validated by ``prepare`` before any trains.

    Raises
    ------
    ConfigError
        On the first bad value, naming its field.
    """
    lrs = {v: per_clients(getattr(args, f"lr_{v}"), args.clients, v) for v in ("a", "b")}
    runs = []
    for i, n in enumerate(args.clients):
        for v in ("a", "b"):
            ov = [
                f"num_clients={n}",
                "progress=false",
                *variant_overrides(v, args.batch, lrs[v][i]),
                *args.overrides,
            ]
            prepare(compose_variant(ov))
            runs.append((n, v, ov))
    return runs


def save(rows: list[dict[str, Any]], out: Path) -> str:
    """Write ``table.md`` and ``table.json`` for the rows so far; return the table."""
    table = format_table(rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(table + "\n")
    (out / "table.json").write_text(json.dumps(rows, indent=2))
    return table


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("outputs/batch_clipping_table"))
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 10])
    ap.add_argument("--batch", type=int, default=64, help="batch size s (a) = m (b)")
    ap.add_argument("--lr-a", type=float, nargs="+", help="per --clients entry (default: TUNED_LR)")
    ap.add_argument("--lr-b", type=float, nargs="+", help="per --clients entry (default: TUNED_LR)")
    ap.add_argument("--render", type=Path, help="only re-print the table of a saved table.json")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run (after --)")
    args = ap.parse_args(argv)
    if args.render:
        print(format_table(json.loads(args.render.read_text())))
        return 0
    try:
        runs = plan(args)
    except ConfigError as exc:
        print(f"batch_clipping_table: error: {exc}", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    for n, v, ov in runs:
        row = run_variant(ov, args.out / f"clients{n}_{v}")
        row.update(clients=n, variant=NAMES[v], overrides=ov)
        rows.append(row)
        save(rows, args.out)  # a later failure keeps the finished rows
        print(
            json.dumps(
                {
                    k: row[k]
                    for k in (
                        "clients",
                        "variant",
                        "accuracy",
                        "epsilon_g1",
                        "epsilon_g8",
                        "wall_time_s",
                    )
                }
            ),
            flush=True,
        )
    print(save(rows, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
