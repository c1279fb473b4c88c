"""Short CIFAR-10 runs for ``make gpu-check``: both experiments on the 5k/1k subset.

``+experiment=cifar10_dpsgd`` (one client, WRN-16-4, augmentation multiplicity) and
``+experiment=cifar10_federated`` (clients sharing the GPU: ``client_resources.num_gpus``
0.25, four per GPU), each shortened to a few steps, run through the ``fedpriv`` command. It
prints, per run: status, accuracy, ε, wall time and training images per second (records x
views x steps / training seconds). The data come from ``--data-dir`` (default
``../shared/data/cifar10-jpg`` beside the checkout, or ``$CIFAR10_DIR``); without it the section
says so and is skipped.

Usage::

    python benchmarks/gpu_cifar.py [--data-dir DIR] [--device cuda|cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DIR = Path(os.environ.get("CIFAR10_DIR", REPO.parent / "shared" / "data" / "cifar10-jpg"))

#: name -> its overrides on CUDA (each experiment shortened)
RUNS: dict[str, list[str]] = {
    "cifar10_dpsgd": [
        "+experiment=cifar10_dpsgd",
        "num_rounds=2",
        "client.steps=5",
        "privacy.sample_rate=0.05",  # 250 of the subset's 5,000 records a step, 16 views each
    ],
    "cifar10_federated": [
        "+experiment=cifar10_federated",
        "num_clients=8",
        "num_rounds=2",
        "client.steps=2",
        "partition.min_size=16",
    ],
}
#: The same runs on CPU (the section's own test): no GPU, the small CNN, 2 views.
CPU = ["client_resources.num_gpus=0", "device=cpu", "client.augmult=2", "model=cifar_cnn"]


def images_per_step(res: dict) -> float:
    """Training images per step over all clients: expected batch x views x clients."""
    cfg = res["config"]
    records = 5000 * float(cfg["privacy"]["sample_rate"])  # the subset's training records
    return records * max(int(cfg["client"].get("augmult") or 0), 1)


def run_one(name: str, data_dir: Path, device: str, out: Path) -> str:
    """One shortened run; its summary line."""
    overrides = [
        *RUNS[name],
        f"dataset.data_dir={data_dir}",
        "dataset.options.subset=true",
        "progress=false",
        "plot=false",
        f"hydra.run.dir={out}",
        *(CPU if device == "cpu" else []),
    ]
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "fedpriv.cli.experiment", *overrides],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        return f"{name}: FAILED (exit {proc.returncode}): {proc.stderr.strip()[-500:]}"
    res = json.loads((out / "results.json").read_text())
    rounds = res["rounds"]
    steps = sum(1 for _ in rounds) * int(res["config"]["client"]["steps"])
    train_s = sum(r["round_time_s"] for r in rounds)
    rate = images_per_step(res) * steps / train_s
    return (
        f"{name}: {res['status']}, accuracy {rounds[-1]['accuracy']:.3f}, "
        f"epsilon {rounds[-1]['epsilon']:.3g} (of the shortened run), wall {wall:.0f} s, "
        f"about {rate:.0f} training images/s (rounds incl. evaluation)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DIR)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = p.parse_args(argv)
    if not (args.data_dir / "cifar10_jpg_subset_5k_train_1k_test.tar.gz").is_file():
        print(f"gpu-check: CIFAR-10 runs skipped: no subset archive in {args.data_dir}")
        return 0
    print(f"# CIFAR-10 on {args.device}, the 5k/1k subset, shortened runs")
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in RUNS:
            line = run_one(name, args.data_dir, args.device, Path(tmp) / name)
            failed += "FAILED" in line
            print(line, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
