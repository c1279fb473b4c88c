"""Client-level DP on full Fashion-MNIST: accuracy at ε ≈ 1, 3, 8 for each sampler (DP-FedAvg)
or each correlated-noise strategy (DP-FTRL).

``--table samplers`` (default): every participation scheme of DP-FedAvg (Poisson at q = 0.02,
fixed-size cohorts of 120 without replacement, random allocation of 1 round in each 50, Poisson
with adaptive clipping) on ``+experiment=client_level_fmnist``. ``--table ftrl``: DP-FedAvg with
Poisson sampling (the identity factorization), tree aggregation, BandMF, amplified BandMF and
BLT on ``+experiment=ftrl_fmnist`` (the same data, model, local training and server momentum).
For every row and target ε the noise multiplier is calibrated to the target over the
experiment's rounds (``privacy.target_epsilon``, each row's own analysis) and the experiment is
run through the Flower simulation, once per ``--seeds`` (the next seeds reuse the calibrated σ;
a rerun with the same ``--out`` runs only the rows its ``runs.csv`` lacks). The Markdown table
gives the final test accuracy (mean over seeds, min-max), the calibrated σ and the final ε.

Usage::

    .venv/bin/python scripts/client_level_table.py --out outputs/client_level \\
        -- dataset.data_dir=../shared/data/fashion-mnist
    .venv/bin/python scripts/client_level_table.py --table ftrl --seeds 0 1 2 \\
        --out outputs/ftrl -- dataset.data_dir=../shared/data/fashion-mnist
    .venv/bin/python scripts/client_level_table.py --render outputs/client_level/runs.csv
    ... --samplers random_allocation --targets 3 8 --out outputs/client_level_b   # a part

Everything after ``--`` is passed to every run (e.g. ``num_rounds=50`` for a quick look).

Ctrl-C (SIGINT) stops the whole table, not just the run in progress: that run gets one SIGINT
(it finishes its round and saves itself as ``stopped``; a second Ctrl-C aborts it), its row is
written as ``interrupted``, ``table.md`` is marked unfinished, and the script exits 130. The
same happens when the SIGINT reaches only the run (``kill -INT`` its pid). A rerun with the same
``--out`` runs what is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: The ``fedpriv`` command each row runs (its overrides appended).
FEDPRIV = [sys.executable, "-m", "fedpriv.cli.experiment"]
#: The status of a row whose run a SIGINT stopped (it stops the table; a rerun redoes it).
INTERRUPTED = "interrupted"
TARGETS = (1.0, 3.0, 8.0)
#: Hydra overrides of each participation scheme (the experiment itself is Poisson, q = 0.02).
SAMPLERS: dict[str, list[str]] = {
    "poisson": [],
    "fixed_size": [
        "client_sampling=fixed_size",
        "client_sample_rate=null",
        "num_sampled_clients=120",
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
#: DP-FTRL rows (``+experiment=ftrl_fmnist``: 50 cyclic groups of 120, each client 10 times).
STRATEGIES: dict[str, list[str]] = {
    "dp_fedavg_poisson": [  # the identity with Poisson q = 0.02 every round: DP-FedAvg
        "privacy.factorization=identity",
        "privacy.min_separation=1",
        "client_sample_rate=0.02",
    ],
    "tree_honaker": ["privacy.factorization=tree_honaker"],
    "bandmf": [],
    "amplified_bandmf": ["privacy.min_separation=25", "client_sample_rate=0.5"],
    "blt": ["privacy.factorization=blt"],
}
#: The neighbouring relation each row's ε is stated under (ε's are on different scales across
#: relations: replacing a client is at most removing one and adding another).
RELATIONS = {"fixed_size": "replace-one"}
TABLES = {
    "samplers": ("client_level_fmnist", SAMPLERS),
    "ftrl": ("ftrl_fmnist", STRATEGIES),
}
FIELDS = (
    "sampler",
    "seed",
    "target_epsilon",
    "status",
    "accuracy",
    "epsilon",
    "noise_multiplier",
    "s",
)


def run_one(
    out: Path,
    table: str,
    sampler: str,
    target: float,
    seed: int,
    extra: list[str],
    sigma: float | None = None,
) -> dict[str, Any]:
    """One run calibrated to ``target`` (or at ``sigma``, the value an earlier seed's calibration
    to that target found: calibration does not depend on the seed); its row (status ``failed``
    with no numbers if it did not finish)."""
    experiment, rows = TABLES[table]
    run_dir = out / f"{sampler}-eps{target:g}-seed{seed}"
    noise = (
        [f"privacy.noise_multiplier={sigma!r}"]
        if sigma is not None
        else ["privacy.noise_multiplier=null", f"privacy.target_epsilon={target}"]
    )
    args = [
        f"+experiment={experiment}",
        *rows[sampler],
        f"seed={seed}",
        *noise,
        "progress=false",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]
    t0 = time.monotonic()
    returncode, interrupted = run_fedpriv(args)
    row: dict[str, Any] = {
        "sampler": sampler,
        "seed": seed,
        "target_epsilon": target,
        "status": INTERRUPTED if interrupted else "failed",
    }
    results = run_dir / "results.json"
    if returncode == 0 and results.exists() and not interrupted:
        r = json.loads(results.read_text())
        row.update(
            status=r["status"],
            accuracy=r["rounds"][-1]["accuracy"],
            epsilon=r["privacy"]["epsilon"],
            noise_multiplier=r["privacy"]["noise_multiplier"],
        )
    row["s"] = round(time.monotonic() - t0, 1)
    return row


def run_fedpriv(args: list[str]) -> tuple[int, bool]:
    """Run ``fedpriv ARGS`` (:data:`FEDPRIV`) to its end: its exit code, and whether a SIGINT
    stopped it.

    The run has its own process group, so a Ctrl-C in the terminal reaches this script only,
    which passes each SIGINT on to the run once (the first stops it after its round, a second
    aborts it) and waits for it to exit. A run that a SIGINT sent to it alone stopped exits
    130 (or -2 before fedpriv handles signals).
    """
    proc = subprocess.Popen([*FEDPRIV, *args], cwd=REPO, stdin=subprocess.DEVNULL, process_group=0)
    interrupted = False
    while True:
        try:
            returncode = proc.wait()
            break
        except KeyboardInterrupt:
            interrupted = True
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
    return returncode, interrupted or returncode in (128 + signal.SIGINT, -signal.SIGINT)


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """``runs.csv``: every row so far (rewritten after every run)."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        w.writerows(rows)


def _read(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``runs.csv`` (none when it does not exist)."""
    if not path.exists():
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


def render(rows: list[dict[str, Any]]) -> str:
    """Markdown: one line per row name, accuracy (mean over seeds, min-max when several; σ,
    final ε) per target."""
    head = "| row | relation | " + " | ".join(f"ε ≈ {t:g}" for t in TARGETS) + " |"
    lines = [head, "|---" * (len(TARGETS) + 2) + "|"]
    names = list(dict.fromkeys(r["sampler"] for r in rows))
    for name in names:
        cells = []
        for t in TARGETS:
            done = [
                x
                for x in rows
                if x["sampler"] == name
                and float(x["target_epsilon"]) == t
                and x["status"] == "complete"
            ]
            cells.append(_cell(done))
        relation = RELATIONS.get(name, "add/remove")
        lines.append(f"| {name} | {relation} | " + " | ".join(cells) + " |")
    note = _replace_one_note(rows)
    return "\n".join(lines) + (f"\n\n{note}" if note else "")


def _replace_one_note(rows: list[dict[str, Any]]) -> str:
    """When a table mixes relations: the Poisson row's ε under replace-one too (same σ,
    dp-accounting's PLD, the symmetric pair that dominates Poisson sampling under
    substitution), the comparison on the fixed-size row's scale."""
    names = {r["sampler"] for r in rows if r["status"] == "complete"}
    if not ({"fixed_size", "poisson"} <= names):
        return ""
    from dp_accounting import dp_event

    from fedpriv.accounting.core.ledger import PrivacyLedger

    parts = []
    for t in TARGETS:
        done = [
            r
            for r in rows
            if r["sampler"] == "poisson" and float(r["target_epsilon"]) == t
            if r["status"] == "complete"
        ]
        if done:
            sigma = float(done[0]["noise_multiplier"])
            ledger = PrivacyLedger("pld", neighboring_relation="replace_one")
            event = dp_event.PoissonSampledDpEvent(0.02, dp_event.GaussianDpEvent(sigma))
            ledger.record(event, 500)
            parts.append(f"ε ≈ {t:g}: {ledger.get_epsilon(1e-5):.3f}")
    return "Poisson rows under replace-one (same σ, q = 0.02, 500 rounds): " + ", ".join(parts)


def _cell(done: list[dict[str, Any]]) -> str:
    """``0.7962`` or ``0.7962 (0.79–0.80, 3 seeds)``, then σ and the largest final ε."""
    if not done:
        return "—"
    acc = [float(r["accuracy"]) for r in done]
    sigma = float(done[0]["noise_multiplier"])
    eps = max(float(r["epsilon"]) for r in done)
    spread = f" ({min(acc):.3f}–{max(acc):.3f}, {len(acc)} seeds)" if len(acc) > 1 else ""
    return f"{sum(acc) / len(acc):.4f}{spread} σ={sigma:.3f}, ε={eps:.3f}"


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "client_level")
    parser.add_argument("--table", choices=list(TABLES), default="samplers")
    names = [*SAMPLERS, *STRATEGIES]
    parser.add_argument("--samplers", nargs="*", choices=names, help="rows (default: all)")
    parser.add_argument("--seeds", nargs="*", type=int, default=[0])
    parser.add_argument("--targets", nargs="*", type=float, default=list(TARGETS))
    parser.add_argument("--render", type=Path, nargs="*", help="only print the table of runs.csv")
    args = parser.parse_args(own)
    if args.render:
        print(render([r for p in args.render for r in _read(p)]))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "runs.csv"
    rows = [r for r in _read(path) if r["status"] == "complete"]  # a rerun adds what is missing
    chosen = args.samplers or list(TABLES[args.table][1])
    try:
        for seed in args.seeds:  # a whole table per seed first
            for sampler in chosen:
                for target in args.targets:
                    same = [
                        r
                        for r in rows
                        if r["sampler"] == sampler and float(r["target_epsilon"]) == target
                    ]
                    if any(int(r["seed"]) == seed for r in same):
                        continue
                    sigma = float(same[0]["noise_multiplier"]) if same else None
                    row = run_one(args.out, args.table, sampler, target, seed, extra, sigma)
                    rows.append(row)
                    _write_rows(path, rows)
                    if row["status"] == INTERRUPTED:
                        stop_unfinished(args.out, rows, row)
    except KeyboardInterrupt:  # between two runs
        _write_rows(path, rows)
        stop_unfinished(args.out, rows, None)
    table = render(rows)
    (args.out / "table.md").write_text(table + "\n")
    print(table)


def stop_unfinished(out: Path, rows: list[dict[str, Any]], row: dict[str, Any] | None) -> None:
    """A SIGINT stopped ``row``'s run (``None``: it came between two runs): write ``table.md``
    of the finished runs marked unfinished, say so in one line and exit 130 (no further run
    starts)."""
    done = sum(r["status"] == "complete" for r in rows)
    where = (
        f"during {row['sampler']} at ε ≈ {float(row['target_epsilon']):g}, seed {row['seed']}"
        if row is not None
        else "between two runs"
    )
    note = (
        f"**Unfinished**: stopped by SIGINT {where}; {done} run(s) complete in runs.csv. "
        "Run the same command again to finish the table."
    )
    (out / "table.md").write_text(f"{note}\n\n{render(rows)}\n")
    print(
        f"client_level_table: stopped by SIGINT {where}; {out / 'runs.csv'} keeps "
        f"{done} complete run(s), {out / 'table.md'} is marked unfinished",
        file=sys.stderr,
    )
    sys.exit(128 + signal.SIGINT)


if __name__ == "__main__":
    main()
