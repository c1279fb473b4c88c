"""GPU clients check: a short default experiment with virtual clients sharing one GPU.

``python benchmarks/gpu_clients.py`` runs the default experiment (tanh CNN, local DP-SGD) for a
few rounds with ``device=cuda client_resources.num_gpus=0.25``: Flower's Ray backend then places
up to 4 client actors on each GPU (fractional GPUs), and every client trains on CUDA (model,
per-sample clipping and the noise generator on the device; the update comes back on the CPU).
It prints each round's time and accuracy and the ε, and checks that the run completed. Without
a CUDA device it prints a clear message and exits 0. Called by ``make gpu-check``
(``benchmarks/gpu_check.py``).
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

OVERRIDES = [
    "device=cuda",
    "client_resources.num_gpus=0.25",
    "num_clients=8",
    "num_rounds=3",
    "client.steps=10",
    "progress=false",
    "plot=false",
]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the check; extra Hydra overrides may be given. Returns the exit code."""
    if not torch.cuda.is_available():
        print(
            "gpu-clients: no CUDA device available (torch.cuda.is_available() is False); "
            "skipping the GPU clients run."
        )
        return 0
    from hydra import compose, initialize_config_dir

    from fedpriv.run.config import conf_dir, register_schema
    from fedpriv.run.runner import run_experiment

    overrides = [*OVERRIDES, *(argv if argv is not None else sys.argv[1:])]
    register_schema()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    print(f"# gpu-clients on {torch.cuda.get_device_name(0)}: {' '.join(overrides)}")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fedpriv_gpu_clients_") as out:
        summary = run_experiment(cfg, Path(out))
    steps = int(cfg.client.steps)
    for r in summary["rounds"]:
        if r.get("status") == "ok":
            print(
                f"round {r['server_round']}: {r['round_time_s']:.2f} s "
                f"({1e3 * r['round_time_s'] / steps:.1f} ms per "
                f"local step, {cfg.num_clients} clients on 4 per GPU), "
                f"accuracy {r['accuracy']:.4f}, "
                f"epsilon {r['epsilon']:.3f}"
            )
    ok = summary["status"] == "complete"
    print(
        f"gpu-clients: {summary['status']} in {time.monotonic() - t0:.1f} s "
        f"({'ok' if ok else 'FAILED'})"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
