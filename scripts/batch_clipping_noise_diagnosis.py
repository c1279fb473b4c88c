"""Why batch clipping + shuffling does not reach DP-SGD's accuracy here: the noise, measured.

Diagnosis for issue 4 (van Dijk et al., "Generalizing DP-SGD with Shuffling and Batch
Clipping", arXiv:2212.05796; MNIST 10k/10k, logistic regression, E epochs, batch B,
sigma, C), run in one process without Flower. The SAME sampler, clipping and learning loop is
trained with three noises:

* ``accounted``: the mechanism the paper's analysis covers (Algorithm 1 with m = 1):
  ``N(0, (2 C sigma)^2 I)`` added to the clipped update -- what fedpriv runs and accounts;
* ``paper-code``: the noise of the public code that appears to be the authors'
  (github.com/MisaNguyen/DPSGD, ``PyTorchProjectFramework/optimizers/DPSGD_optimizer.py``):
  ``torch.normal(mean=torch.Tensor([0.0]), std=sigma * C)`` is ONE scalar per parameter tensor,
  broadcast over all its coordinates, then multiplied by ``1 / batch_size`` in both the
  batch-clipping and the individual-clipping branch. **This is not differentially private at
  the stated sigma and no accountant in fedpriv covers it**; it is trained here only to see
  whether it explains the paper's accuracy parity;
* ``none``: clipping without noise (the non-private ceiling).

Variant (a) is batch clipping (one mini-batch gradient of B shuffled records, clipped to C);
(b) is individual clipping with subsampling (B records drawn uniformly per round, N // B rounds
an epoch; per-sample gradients clipped to C, summed, divided by B). For each (variant, noise)
every learning rate of ``--lrs`` is trained with ``--seeds`` seeds; the table shows the best
mean test accuracy and its lr (selected on the test set: optimistic, equally for every row).

Usage::

    .venv/bin/python scripts/batch_clipping_noise_diagnosis.py --data-dir ../shared/data/mnist \
        [--epochs 10] [--batch 64] [--sigma 2] [--seeds 3] [--out outputs/bc_noise_diagnosis.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedpriv.data.images import load_mnist
from fedpriv.mechanisms.clipping import clip_tensors
from fedpriv.mechanisms.persample import clipped_grad_sum
from fedpriv.mechanisms.samplers import ShuffleSampler, SubsampleSampler
from fedpriv.models.zoo import build_model

LRS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0)
NOISES = ("accounted", "paper-code", "none")


def summed_ce(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy of a batch (the loss whose per-record gradients are clipped)."""
    return nn.functional.cross_entropy(out, y, reduction="sum")


def clipped_update(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, variant: str, c: float
) -> list[torch.Tensor]:
    """(a): ``[mean-batch gradient]_C``; (b): ``sum_i [grad_i]_C / B``. Shapes of the parameters."""
    if variant == "a":
        model.zero_grad()
        (summed_ce(model(x), y) / len(y)).backward()
        return clip_tensors([p.grad.detach() for p in model.parameters()], c)
    sums, _ = clipped_grad_sum(model, summed_ce, x, y, c)
    return [g / len(y) for g in sums.values()]


def noise_like(
    update: list[torch.Tensor],
    noise: str,
    variant: str,
    sigma: float,
    c: float,
    b: int,
    gen: torch.Generator,
) -> list[torch.Tensor]:
    """The noise added to ``update`` (same shapes); see the module docstring."""
    if noise == "none":
        return [torch.zeros_like(u) for u in update]
    if noise == "paper-code":  # one N(0, (sigma C)^2) scalar per tensor, broadcast, / B
        return [torch.randn((1,), generator=gen).mul(sigma * c / b).expand_as(u) for u in update]
    scale = 2 * c * sigma / (1 if variant == "a" else b)  # (2 C sigma) on U, U divided by m
    return [torch.randn(u.shape, generator=gen).mul(scale) for u in update]


def rounds(variant: str, n: int, b: int, epochs: int, rng: np.random.Generator):
    """Index batches of shape ``(1, b)`` or ``(b, 1)``: shuffled epochs for (a), subsampled
    rounds for (b)."""
    if variant == "a":
        sampler = ShuffleSampler(num_groups=1, group_size=b)
        for _ in range(epochs):
            yield from sampler.epoch(n, rng)
    else:
        sub = SubsampleSampler(num_groups=b, group_size=1)
        for _ in range(epochs * sub.rounds_per_epoch(n)):
            yield sub.sample(n, rng)


def train(data, variant: str, noise: str, lr: float, seed: int, args) -> float:
    """Train one configuration; return its test accuracy."""
    torch.manual_seed(seed)
    model = build_model("logistic", data.input_shape, data.num_classes)
    gen = torch.Generator().manual_seed(seed + 1)
    rng = np.random.default_rng(seed)
    x, y = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
    for idx in rounds(variant, len(y), args.batch, args.epochs, rng):
        i = torch.from_numpy(idx.reshape(-1))
        upd = clipped_update(model, x[i], y[i], variant, args.clip)
        nz = noise_like(upd, noise, variant, args.sigma, args.clip, args.batch, gen)
        with torch.no_grad():
            for p, u, z in zip(model.parameters(), upd, nz):
                p.sub_(lr * (u + z))
    with torch.no_grad():
        pred = model(torch.from_numpy(data.x_test)).argmax(1).numpy()
    return float((pred == data.y_test).mean())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default="../shared/data/mnist")
    ap.add_argument("--train-limit", type=int, default=10000)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--sigma", type=float, default=2.0)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--lrs", type=float, nargs="+", default=list(LRS))
    ap.add_argument("--out", default="outputs/bc_noise_diagnosis.json")
    args = ap.parse_args(argv)
    for name, ok in (
        ("epochs", args.epochs >= 1),
        ("seeds", args.seeds >= 1),
        ("batch", args.batch >= 1),
        ("sigma", args.sigma >= 0),
        ("clip", args.clip > 0),
        ("lrs", min(args.lrs) > 0),
    ):
        if not ok:
            ap.error(
                f"--{name}={getattr(args, name)} is out of range "
                "(epochs, seeds, batch >= 1; sigma >= 0; clip, lrs > 0)"
            )
    torch.set_num_threads(1)
    data = load_mnist(args.data_dir, train_limit=args.train_limit)
    if args.batch > len(data.y_train):
        ap.error(f"--batch={args.batch} must be <= the {len(data.y_train)} training records")
    rows, t0 = [], time.monotonic()
    for variant in ("a", "b"):
        for noise in NOISES:
            accs = {
                lr: [train(data, variant, noise, lr, s, args) for s in range(args.seeds)]
                for lr in args.lrs
            }
            lr = max(accs, key=lambda k: np.mean(accs[k]))
            rows.append(
                {
                    "variant": variant,
                    "noise": noise,
                    "lr": lr,
                    "mean": float(np.mean(accs[lr])),
                    "std": float(np.std(accs[lr])),
                    "all": {str(k): v for k, v in accs.items()},
                }
            )
            print(
                f"({variant}) {noise:10s} best lr {lr:g}: {100 * rows[-1]['mean']:.1f} ± "
                f"{100 * rows[-1]['std']:.1f}%  [{time.monotonic() - t0:.0f} s]",
                flush=True,
            )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    print("\n| variant | noise | best lr | test acc. (mean ± sd over seeds) |\n|---|---|---|---|")
    for r in rows:
        print(
            f"| ({r['variant']}) | {r['noise']} | {r['lr']:g} "
            f"| {100 * r['mean']:.1f} ± {100 * r['std']:.1f}% |"
        )


if __name__ == "__main__":
    main()
