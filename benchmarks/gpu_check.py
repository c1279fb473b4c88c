"""CUDA device check: the DP step rows of ``bench_steps.py`` on the GPU (``make gpu-check``).

Prints a clear message and exits 0 when no CUDA device is present. On a GPU it first checks
that the fast per-sample path equals the reference path on CUDA (tanh CNN, WRN-16-4, WRN-16-4
with 2 views per record; float32 against a float64 reference), then prints the step
table of the default models, WRN-16-4 and augmentation multiplicity 4 (wall-clock after
``torch.cuda.synchronize``, peak ``torch.cuda.max_memory_allocated``; the CIFAR-10 CNN's DP step
against Opacus's), virtual clients sharing the GPU (``gpu_clients.py``) and short CIFAR-10 runs
of both experiments (``gpu_cifar.py``).

Usage::

    python benchmarks/gpu_check.py [--batch-sizes 64 256] [--rounds 15]
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_steps  # noqa: E402

from fedpriv.mechanisms.persample import (  # noqa: E402
    clipped_grad_sum,
    clipped_group_grad_sum,
    reference_clipped_grad_sum,
    reference_group_grad_sum,
)
from fedpriv.models.zoo import build_model  # noqa: E402


def _rel(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest relative difference over the parameters (float64)."""
    return max(float((a[k].double() - b[k]).norm() / b[k].norm().clamp_min(1e-12)) for k in b)


def check_fast_equals_reference(device: torch.device) -> bool:
    """Whether the fast path's clipped sums (float32) are as close to the reference path in
    float64 as the float32 reference path is, on ``device``, for the tanh CNN (batch 32),
    WRN-16-4 (batch 8) and WRN-16-4 with 2 views per record: within 1e-3 relative, or twice
    the float32 reference's own error (WRN-16-4's weight-standardized gradients lose ~4e-3
    in float32 on either path). TF32 is off meanwhile (it alone moves convolutions by ~1e-3).
    Prints a line per case."""

    def loss(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, t, reduction="sum")

    ok, tf32 = True, torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    for name, shape, batch, views in [
        ("tanh_cnn", (1, 28, 28), 32, 0),
        ("wrn16_4", (3, 32, 32), 8, 0),
        ("wrn16_4", (3, 32, 32), 8, 2),
    ]:
        torch.manual_seed(0)
        model = build_model(name, shape, 10).to(device)
        x = torch.randn(batch, *([views] if views else []), *shape, device=device)
        y = torch.randint(0, 10, x.shape[: 2 if views else 1], device=device)
        model64, x64 = copy.deepcopy(model).double(), x.double()
        if views:
            fast = clipped_group_grad_sum(model, loss, x, y, 0.5)
            ref32 = reference_group_grad_sum(model, loss, x, y, 0.5)
            ref = reference_group_grad_sum(model64, loss, x64, y, 0.5)
        else:
            fast, _ = clipped_grad_sum(model, loss, x, y, 0.5)
            ref32, _ = reference_clipped_grad_sum(model, loss, x, y, 0.5)
            ref, _ = reference_clipped_grad_sum(model64, loss, x64, y, 0.5)
        assert fast is not None
        err, err32 = _rel(fast, ref), _rel(ref32, ref)
        good = err <= max(1e-3, 2 * err32)
        ok = ok and good
        print(
            f"  {name}, {views or 1} view(s): fast {err:.1e}, float32 reference {err32:.1e} "
            f"off float64 ({'ok' if good else 'FAILED'})"
        )
    torch.backends.cudnn.allow_tf32 = tf32
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    if not torch.cuda.is_available():
        print(
            "gpu-check: no CUDA device available (torch.cuda.is_available() is False); "
            "nothing to do."
        )
        return 0
    models = [*bench_steps.DEFAULT_MODELS, "wrn16_4"]
    args = bench_steps.parse_args(
        ["--device", "cuda", "--models", *models, "--augmult", "4"]
        + list(argv if argv is not None else sys.argv[1:])
    )
    device = torch.device("cuda")
    print(f"# gpu-check on {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    print("fast path vs reference path on CUDA (relative difference of the clipped sums):")
    same = check_fast_equals_reference(device)
    print()
    methods = bench_steps.METHODS + bench_steps.augmult_methods(args.augmult)
    rows = bench_steps.run(args, methods if args.augmult > 0 else bench_steps.METHODS)
    print(bench_steps.format_table(rows, bench_steps.memory_method(device)))
    import gpu_clients  # virtual clients sharing the GPU through Flower (H8's section)

    print()
    clients_rc = gpu_clients.main([])
    import gpu_cifar  # short CIFAR-10 runs: WRN-16-4 on one GPU, clients at num_gpus=0.25

    print()
    cifar_rc = gpu_cifar.main([])
    return 0 if same and clients_rc == 0 and cifar_rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
