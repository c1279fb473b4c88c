"""The figures of docs/auditing.md ("Measured"): ``audit=canaries`` on the embedded Fashion-MNIST.

Runs, through Flower, a logistic model for 3 rounds in each setting of ``ROWS`` (the same
settings as ``tests/test_audit.py``) and prints one markdown row per run: accounted ε, the
audit's ε lower bound at 95% (Steinke, Nasr, Jagielski, arXiv:2305.08846), correct guesses
out of 200, and for client-level runs the Gaussian-fit estimate (Andrew et al.,
arXiv:2302.03098; an estimate, not a bound).

Usage::

    .venv/bin/python scripts/audit_table.py [--out outputs/audit_table]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

BASE = [
    "audit=canaries",
    "model=logistic",
    "num_rounds=3",
    "num_workers=1",
    "progress=false",
    "plot=false",
    "save_model=false",
    "ray_init_args.num_cpus=1",
]
CL = ["client=client_level", "privacy=client_level", "num_clients=40"]
BROADCAST = "client._target_=examples.broadcast_noise.BroadcastNoiseDPSGD"
ROWS = [
    ("(a) record, noise off", ["privacy.noise_multiplier=0"]),
    ("(a) client, noise off", [*CL, "privacy.noise_multiplier=0"]),
    ("(b) record, σ=1.2, seed 0", ["seed=0"]),
    ("(b) record, σ=1.2, seed 1", ["seed=1"]),
    ("(b) record, σ=1.2, seed 2", ["seed=2"]),
    ("(b) record, σ=5", ["privacy.noise_multiplier=5"]),
    ("(b) client, σ=1, Poisson q=0.5", [*CL, "client_sampling=poisson", "client_sample_rate=0.5"]),
    ("(c) record, broadcast scalar noise, σ=5", [BROADCAST, "privacy.noise_multiplier=5"]),
]


def main() -> None:
    from hydra import compose, initialize_config_dir

    from fedpriv.run.config import conf_dir, register_schema
    from fedpriv.run.runner import run_experiment

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="folder for audit_table.json")
    args = parser.parse_args()
    register_schema()
    table = []
    print("| run | accounted ε | audited ε lower bound (95%) | correct / guesses | estimate |")
    print("|---|---:|---:|---:|---:|")
    for name, extra in ROWS:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            cfg = compose(config_name="config", overrides=[*BASE, *extra])
        with tempfile.TemporaryDirectory() as tmp:
            summary = run_experiment(cfg, Path(tmp))
        last, p = summary["rounds"][-1], summary["privacy"]
        est = p.get("audit_epsilon_estimate_gaussian_fit")
        row = {
            "run": name,
            "overrides": extra,
            "epsilon": last["epsilon"],
            "audit_epsilon_lower_bound": p["audit_epsilon_lower_bound"],
            "correct": p["audit_correct_guesses"],
            "guesses": p["audit_guesses"],
            "estimate": est,
        }
        table.append(row)
        est_s = "" if est is None else f"{est:.2f}"
        print(
            f"| {name} | {last['epsilon']:.3f} | {row['audit_epsilon_lower_bound']:.2f} | "
            f"{row['correct']} / {row['guesses']} | {est_s} |",
            flush=True,
        )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "audit_table.json").write_text(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
