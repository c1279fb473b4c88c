"""CUDA device check: the DP step rows of ``bench_steps.py`` on the GPU (``make gpu-check``).

Prints a clear message and exits 0 when no CUDA device is present. On a GPU it first checks
that the fast per-sample path equals the reference path on CUDA (tanh CNN, batch 32, float32
tolerance 1e-3 relative: TF32/cuDNN), then prints the step table (wall-clock after
``torch.cuda.synchronize``, peak ``torch.cuda.max_memory_allocated``; the CIFAR-10 CNN's DP step
against Opacus's), virtual clients sharing the GPU (``gpu_clients.py``) and short CIFAR-10 runs
of both experiments (``gpu_cifar.py``).

Usage::

    python benchmarks/gpu_check.py [--batch-sizes 64 256] [--rounds 15]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_steps  # noqa: E402

from fedpriv.mechanisms.persample import clipped_grad_sum, reference_clipped_grad_sum  # noqa: E402
from fedpriv.models.zoo import build_model  # noqa: E402


def check_fast_equals_reference(device: torch.device) -> float:
    """Largest relative difference of the clipped sums, fast vs reference path, on ``device``."""
    torch.manual_seed(0)
    model = build_model("tanh_cnn", (1, 28, 28), 10).to(device)
    x = torch.randn(32, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (32,), device=device)

    def loss(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, t, reduction="sum")

    fast, _ = clipped_grad_sum(model, loss, x, y, 0.5)
    ref, _ = reference_clipped_grad_sum(model, loss, x, y, 0.5)
    return max(float((fast[k] - ref[k]).norm() / ref[k].norm().clamp_min(1e-12)) for k in ref)


def main(argv: Sequence[str] | None = None) -> int:
    if not torch.cuda.is_available():
        print(
            "gpu-check: no CUDA device available (torch.cuda.is_available() is False); "
            "nothing to do."
        )
        return 0
    args = bench_steps.parse_args(
        ["--device", "cuda", *(argv if argv is not None else sys.argv[1:])]
    )
    device = torch.device("cuda")
    print(f"# gpu-check on {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    err = check_fast_equals_reference(device)
    print(
        f"fast path vs reference on CUDA: max relative difference {err:.2e} "
        f"({'ok' if err < 1e-3 else 'FAILED'}, tolerance 1e-3)\n"
    )
    rows = bench_steps.run(args)
    print(bench_steps.format_table(rows, bench_steps.memory_method(device)))
    import gpu_clients  # virtual clients sharing the GPU through Flower (H8's section)

    print()
    clients_rc = gpu_clients.main([])
    import gpu_cifar  # short CIFAR-10 runs: WRN-16-4 on one GPU, clients at num_gpus=0.25

    print()
    cifar_rc = gpu_cifar.main([])
    return 0 if err < 1e-3 and clients_rc == 0 and cifar_rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
