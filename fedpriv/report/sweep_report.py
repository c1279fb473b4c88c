"""``fedpriv-report SWEEP_DIR``: one table and one privacy-utility plot for a sweep.

Reads every job of a sweep (``SWEEP_DIR/sweep.json`` written by the ``ray`` launcher, or the
job directories of any Hydra multirun: ``*/results.json`` with ``*/.hydra/overrides.yaml``) and
writes ``SWEEP_DIR/report.csv``, ``SWEEP_DIR/report.md`` (one row per job: every override,
final accuracy, ε at δ, wall time, status) and ``SWEEP_DIR/privacy_utility.png`` (final
accuracy against ε; one line per varied parameter except ``seed``, each point the mean over
the jobs that share that parameter's value). Failed jobs stay in the table, marked ``failed``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

#: The sweep's manifest file (one record per job), written by :mod:`fedpriv.run.sweep`.
MANIFEST = "sweep.json"

FIGURES = ("accuracy", "epsilon", "delta", "relation", "wall_time_s", "status", "message")
REPLICATES = ("seed",)  # varied for repetition: averaged over, never a line of its own


def _override_map(overrides: list[str]) -> dict[str, str]:
    """``["a.b=1", "+x=y"]`` -> ``{"a.b": "1", "+x": "y"}`` (Hydra override strings as given)."""
    out = {}
    for o in overrides:
        key, _, value = o.partition("=")
        out[key] = re.sub(r"\\(.)", r"\1", value)  # Hydra escapes ':' etc. in override strings
    return out


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _hydra_overrides(job_dir: Path) -> list[str]:
    path = job_dir / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return []
    from omegaconf import OmegaConf

    return [
        str(o) for o in OmegaConf.load(path) if not str(o).startswith(("ray_init_args.", "hydra."))
    ]


def collect(sweep_dir: Path) -> list[dict[str, Any]]:
    """One row per job: ``job``, ``dir``, ``overrides`` (dict) and the :data:`FIGURES`.

    Raises
    ------
    FileNotFoundError
        If ``sweep_dir`` holds no ``sweep.json`` and no job directory.
    """
    manifest = _read_json(sweep_dir / MANIFEST)
    if manifest is not None:
        jobs = [(j["num"], Path(j["dir"]), j["overrides"], j) for j in manifest["jobs"]]
    else:
        dirs = sorted(
            (p.parent for p in sweep_dir.glob("*/results.json")),
            key=lambda p: (len(p.name), p.name),
        )
        jobs = [(i, d, _hydra_overrides(d), {}) for i, d in enumerate(dirs)]
    if not jobs:
        raise FileNotFoundError(
            f"{sweep_dir} holds no {MANIFEST} and no */results.json: not a sweep directory"
        )
    return [_row(num, d, overrides, meta) for num, d, overrides, meta in jobs]


def _row(num: int, job_dir: Path, overrides: list[str], meta: dict[str, Any]) -> dict[str, Any]:
    res = _read_json(job_dir / "results.json") or {}
    ok = [r for r in res.get("rounds", []) if r.get("status") == "ok"]
    status = meta.get("status") or res.get("status", "failed")
    if status == "running" and not meta:
        status = "failed"  # a run that never finished
    privacy = res.get("privacy", {})
    wall = (
        meta.get("wall_time_s") if meta.get("wall_time_s") is not None else res.get("wall_time_s")
    )
    return {
        "job": num,
        "dir": str(job_dir),
        "overrides": _override_map(overrides),
        "accuracy": float(ok[-1]["accuracy"]) if ok else math.nan,
        "epsilon": float(privacy["epsilon"]) if ok and "epsilon" in privacy else math.nan,
        "delta": privacy.get("delta", ""),
        "relation": privacy.get("neighboring_relation", ""),  # ε's scale: add/remove, replace-one
        "wall_time_s": float(wall) if wall is not None else math.nan,
        "status": status,
        "message": meta.get("message") or res.get("message", ""),
    }


def varied(rows: list[dict[str, Any]]) -> list[str]:
    """Override keys whose value differs between jobs (in first-seen order)."""
    keys = list(dict.fromkeys(k for r in rows for k in r["overrides"]))
    return [k for k in keys if len({r["overrides"].get(k) for r in rows}) > 1]


def table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and string cells: job, every override key, then the :data:`FIGURES`."""
    keys = list(dict.fromkeys(k for r in rows for k in r["overrides"]))
    header = ["job", *keys, *FIGURES]

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return "" if math.isnan(v) else f"{v:.4g}"
        return str(v)

    cells = [
        [str(r["job"]), *(r["overrides"].get(k, "") for k in keys), *(fmt(r[f]) for f in FIGURES)]
        for r in rows
    ]
    return header, cells


def write_tables(rows: list[dict[str, Any]], out_dir: Path) -> tuple[Path, Path]:
    """Write ``report.csv`` and ``report.md`` into ``out_dir``; return their paths."""
    header, cells = table(rows)
    csv_path, md_path = out_dir / "report.csv", out_dir / "report.md"
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(cells)
    esc = [[c.replace("|", "\\|") for c in row] for row in cells]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in esc]
    md_path.write_text("\n".join(lines) + "\n")
    return csv_path, md_path


def plot_privacy_utility(rows: list[dict[str, Any]], path: Path) -> Path:
    """Accuracy against ε: every finished job as a grey dot, and for each varied parameter
    (``seed`` excepted: repetitions are averaged over) a line through the (mean ε, mean
    accuracy) of the jobs sharing each of its values."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] != "failed" and not math.isnan(r["accuracy"])]
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    ax.scatter(
        [r["epsilon"] for r in ok],
        [r["accuracy"] for r in ok],
        color="0.7",
        s=14,
        label="jobs",
        zorder=1,
    )
    for key in [k for k in varied(rows) if k.lstrip("+~") not in REPLICATES]:
        groups: dict[str, list[dict[str, Any]]] = {}
        for r in ok:
            groups.setdefault(r["overrides"].get(key, ""), []).append(r)
        pts = sorted(
            (sum(r["epsilon"] for r in g) / len(g), sum(r["accuracy"] for r in g) / len(g), v)
            for v, g in groups.items()
        )
        line = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=key, zorder=2)[0]
        for x, y, v in pts:
            ax.annotate(
                v,
                (x, y),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize=7,
                color=line.get_color(),
            )
    failed = len(rows) - len(ok)
    relations = sorted({str(r["relation"]) for r in ok if r["relation"]})
    scale = " and ".join(relations) if relations else "the run's relation"
    warn = " — different scales" if len(relations) > 1 else ""
    ax.set_xlabel(f"ε (final, at the run's δ; neighbours: {scale}{warn})")
    ax.set_ylabel("final test accuracy")
    ax.set_title("privacy-utility" + (f" ({failed} failed job(s) not shown)" if failed else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def report(sweep_dir: Path) -> dict[str, Path]:
    """Write the table (CSV, Markdown) and the plot for ``sweep_dir``; return their paths."""
    sweep_dir = Path(sweep_dir)
    rows = collect(sweep_dir)
    csv_path, md_path = write_tables(rows, sweep_dir)
    png = plot_privacy_utility(rows, sweep_dir / "privacy_utility.png")
    return {"csv": csv_path, "markdown": md_path, "plot": png}


def main(argv: list[str] | None = None) -> int:
    """Console entry point; prints the Markdown table.

    Exit code 2 if ``SWEEP_DIR`` is not a sweep.
    """
    parser = argparse.ArgumentParser(prog="fedpriv-report", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path, help="a sweep directory (hydra.sweep.dir)")
    args = parser.parse_args(argv)
    try:
        paths = report(args.sweep_dir)
    except FileNotFoundError as exc:
        print(f"fedpriv-report: error: {exc}", file=sys.stderr)
        return 2
    print(paths["markdown"].read_text(), end="")
    failed = [r["job"] for r in collect(args.sweep_dir) if r["status"] == "failed"]
    if failed:
        print(f"failed jobs: {failed}")
    print(f"wrote {paths['csv']}, {paths['markdown']}, {paths['plot']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
