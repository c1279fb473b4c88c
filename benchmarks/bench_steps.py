"""Step-cost benchmark: non-private SGD vs per-sample DP-SGD (fedpriv, Opacus) vs batch clipping.

``make bench`` runs it. For each model (tanh CNN 28x28, the CIFAR-10 tanh CNN 3x32x32, logistic
regression on 1024-d inputs, MLP 784-256-10) and batch size, every method's step runs side by
side in one process, interleaved in rounds, and the median ms/step is reported with its ratio to
the non-private step of the same model and batch. Peak memory is measured per method in a fresh
forked child (``ru_maxrss`` increase over its first step, from just before the first step) on
CPU, or as ``torch.cuda.max_memory_allocated`` above the allocation before the first step on
CUDA.

Sections are functions (``step_section``, ``memory_section``); ``main`` runs them. Usage::

    python benchmarks/bench_steps.py [--threads 1] [--batch-sizes 64 256] [--no-memory]
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import resource
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fedpriv.mechanisms.ghost import batch_clipped_grad
from fedpriv.mechanisms.noise import add_gaussian_noise
from fedpriv.mechanisms.persample import (
    clipped_grad_sum,
    clipped_group_grad_sum,
    reference_clipped_grad_sum,
    reference_group_grad_sum,
)
from fedpriv.models.zoo import build_model

MODELS: dict[str, tuple[int, ...]] = {
    "tanh_cnn": (1, 28, 28),
    "cifar_cnn": (3, 32, 32),
    "logistic": (1024,),
    "mlp": (784,),
    "wrn16_4": (3, 32, 32),
}
DEFAULT_MODELS = ("tanh_cnn", "cifar_cnn", "logistic", "mlp")
"""``make bench``'s models; WRN-16-4 (2.7M parameters) only when asked for (``--models``)."""
NOISE_MULTIPLIER = 1.0
MAX_GRAD_NORM = 1.0
LR = 0.05

Step = Callable[[], None]
Maker = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Generator], Step]


def summed_ce(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy summed over the batch (the per-sample loss contract)."""
    return F.cross_entropy(out, y, reduction="sum")


def make_nonprivate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator
) -> Step:
    """Plain mini-batch SGD step on the mean loss."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def _fedpriv_dp(
    clip_sum: Callable[..., tuple[dict[str, torch.Tensor], torch.Tensor]], noise: bool
) -> Maker:
    def make(model: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator) -> Step:
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        params = dict(model.named_parameters())
        stddev = NOISE_MULTIPLIER * MAX_GRAD_NORM if noise else 0.0

        def step() -> None:  # clipped_grad_sum + noise + step, as clients/local_dpsgd.py
            sums, _ = clip_sum(model, summed_ce, x, y, MAX_GRAD_NORM)
            noisy = add_gaussian_noise(sums, stddev, gen)
            for k, p in params.items():
                p.grad = noisy[k].div_(x.shape[0])
            opt.step()

        return step

    return make


def make_batch_clipping(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator
) -> Step:
    """Batch clipping: clip the mean gradient, add N(0, (2 C sigma)^2), step.

    Algorithm 1 with m = 1 of van Dijk et al., "Generalizing DP-SGD with Shuffling and Batch
    Clipping", arXiv:2212.05796.
    """
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    params = dict(model.named_parameters())

    def step() -> None:
        grads = batch_clipped_grad(model, summed_ce, x, y, MAX_GRAD_NORM)
        noisy = add_gaussian_noise(grads, 2 * MAX_GRAD_NORM * NOISE_MULTIPLIER, gen)
        for k, p in params.items():
            p.grad = noisy[k]
        opt.step()

    return step


def _augmult(views: int, clip_sum: Callable[..., dict[str, torch.Tensor] | None]) -> Maker:
    """A DP-SGD step on ``views`` copies of each record, its gradient the mean over them,
    clipped after averaging (``clients/local_dpsgd.py``'s augmentation multiplicity; the
    crops themselves are left out: they cost the same on every path)."""

    def make(model: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator) -> Step:
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        params = dict(model.named_parameters())
        xv = x.unsqueeze(1).expand(-1, views, *x.shape[1:]).contiguous()
        yv = y.unsqueeze(1).expand(-1, views).contiguous()

        def step() -> None:
            sums = clip_sum(model, summed_ce, xv, yv, MAX_GRAD_NORM)
            assert sums is not None
            noisy = add_gaussian_noise(sums, NOISE_MULTIPLIER * MAX_GRAD_NORM, gen)
            for k, p in params.items():
                p.grad = noisy[k].div_(x.shape[0])
            opt.step()

        return step

    return make


def augmult_methods(views: int) -> tuple[Method, ...]:
    """The fast and the reference (torch.func) step with ``views`` views per record, and the
    non-private step on all the views."""

    def plain(model: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator) -> Step:
        xv = x.repeat_interleave(views, 0)
        return make_nonprivate(model, xv, y.repeat_interleave(views, 0), gen)

    return (
        Method(f"non-private SGD on {views} views per record", plain),
        Method(
            f"fedpriv DP-SGD, augmult {views} (fast path)", _augmult(views, clipped_group_grad_sum)
        ),
        Method(
            f"fedpriv DP-SGD, augmult {views} (torch.func)",
            _augmult(views, reference_group_grad_sum),
        ),
    )


def make_noise_only(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator
) -> Step:
    """Only the Gaussian noise of a DP step (``add_gaussian_noise`` on every parameter).

    Not a training step: it shows the floor that drawing one Gaussian per parameter puts under
    any DP step, whatever the clipping method.
    """
    params = {k: p.detach() for k, p in model.named_parameters()}
    stddev = NOISE_MULTIPLIER * MAX_GRAD_NORM

    def step() -> None:
        add_gaussian_noise(params, stddev, gen)

    return step


def _opacus(mode: str) -> Maker:
    def make(model: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator) -> Step:
        from opacus import PrivacyEngine
        from torch.utils.data import DataLoader, TensorDataset

        opt = torch.optim.SGD(model.parameters(), lr=LR)
        loader = DataLoader(TensorDataset(x, y), batch_size=x.shape[0])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = PrivacyEngine().make_private(
                module=model,
                optimizer=opt,
                criterion=nn.CrossEntropyLoss(),
                data_loader=loader,
                noise_multiplier=NOISE_MULTIPLIER,
                max_grad_norm=MAX_GRAD_NORM,
                poisson_sampling=False,
                grad_sample_mode=mode,
                noise_generator=gen,
            )
        if mode == "ghost":
            dp_model, dp_opt, criterion, _ = out
        else:
            (dp_model, dp_opt, _), criterion = out, nn.CrossEntropyLoss()

        def step() -> None:
            dp_opt.zero_grad()
            criterion(dp_model(x), y).backward()
            dp_opt.step()

        return step

    return make


@dataclass(frozen=True)
class Method:
    """A benchmarked step: table label, builder, and the target ratio to non-private (or None)."""

    name: str
    make: Maker
    target: float | None = None


METHODS: tuple[Method, ...] = (
    Method("non-private SGD", make_nonprivate),
    Method("fedpriv DP-SGD (fast path)", _fedpriv_dp(clipped_grad_sum, noise=True), 1.5),
    Method("fedpriv clip only, no noise", _fedpriv_dp(clipped_grad_sum, noise=False)),
    Method("(Gaussian noise alone)", make_noise_only),
    Method("fedpriv reference (torch.func)", _fedpriv_dp(reference_clipped_grad_sum, noise=True)),
    Method("Opacus hooks", _opacus("hooks")),
    Method("Opacus ghost clipping", _opacus("ghost")),
    Method("fedpriv batch clipping", make_batch_clipping, 1.1),
)


def setup(name: str, batch: int, device: torch.device, method: Method, seed: int = 0) -> Step:
    """Build a fresh model (same init for every method), data and the method's step."""
    torch.manual_seed(seed)
    model = build_model(name, MODELS[name], 10).to(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(batch, *MODELS[name], generator=gen, device=device)
    y = torch.randint(0, 10, (batch,), generator=gen, device=device)
    return method.make(copy.deepcopy(model), x, y, gen)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clock_for(device: torch.device, threads: int) -> Callable[[], float]:
    """The timer: this thread's CPU time on CPU with one thread, else wall-clock.

    With ``torch.set_num_threads(1)`` every op runs in the calling thread, so its CPU time is
    the step's cost without the time the OS gave to other processes (this machine is shared);
    with more threads or on CUDA, wall-clock (after ``torch.cuda.synchronize``) is used.
    """
    return time.thread_time if device.type == "cpu" and threads == 1 else time.perf_counter


def time_cell(
    name: str,
    batch: int,
    device: torch.device,
    methods: Sequence[Method],
    rounds: int,
    block_s: float,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Per-step seconds of each method, interleaved: ``rounds`` blocks of about ``block_s``."""
    steps = {m.name: setup(name, batch, device, m) for m in methods}
    per_block: dict[str, int] = {}
    per_step: dict[str, float] = {}
    for m in methods:  # warm-up, then size each block to about block_s
        for _ in range(2):
            steps[m.name]()
        _sync(device)
        t0 = clock()
        steps[m.name]()
        _sync(device)
        per_step[m.name] = max(clock() - t0, 1e-6)
        per_block[m.name] = max(1, int(block_s / per_step[m.name]))
    times: dict[str, list[float]] = {m.name: [] for m in methods}
    for r in range(rounds):
        for m in methods:
            k = per_block[m.name]
            if k == 1 and r % 2 == 1 and per_step[m.name] > 5 * block_s:
                continue  # slow reference rows: every other round (still >= rounds/2 samples)
            t0 = clock()
            for _ in range(k):
                steps[m.name]()
            _sync(device)
            times[m.name].append((clock() - t0) / k)
    return times


def _peak_child(name: str, batch: int, device: torch.device, method: Method, threads: int) -> float:
    """Peak memory increase (MiB) of the first step of ``method`` in a forked child.

    On CPU measured as ``ru_maxrss``.
    """
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: measure and report through the pipe, never return
        try:
            torch.set_num_threads(threads)
            step = setup(name, batch, device, method)
            gc.collect()
            base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
            step()
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            os.write(write, f"{(peak - base) / 1024:.1f}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        text = f.read()
    os.waitpid(pid, 0)
    return float(text) if text else float("nan")


def _peak_cuda(name: str, batch: int, device: torch.device, method: Method) -> float:
    """Peak CUDA allocation (MiB) above the allocation before the first of 3 steps."""
    step = setup(name, batch, device, method)
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    for _ in range(3):
        step()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    del step
    gc.collect()
    torch.cuda.empty_cache()
    return (peak - base) / 2**20


def memory_section(
    models: Sequence[str],
    batch_sizes: Sequence[int],
    device: torch.device,
    methods: Sequence[Method],
    threads: int,
) -> dict[tuple[str, int, str], float]:
    """Peak memory per (model, batch, method) in MiB. On CPU run it before any timing (fork)."""
    out = {}
    for name in models:
        for batch in batch_sizes:
            for m in methods:
                if device.type == "cuda":
                    out[(name, batch, m.name)] = _peak_cuda(name, batch, device, m)
                else:
                    out[(name, batch, m.name)] = _peak_child(name, batch, device, m, threads)
    return out


@dataclass(frozen=True)
class Row:
    """One line of the step table."""

    model: str
    batch: int
    method: str
    ms: float
    ratio: float
    target: float | None
    peak_mib: float | None


def step_section(
    models: Sequence[str],
    batch_sizes: Sequence[int],
    device: torch.device,
    methods: Sequence[Method] = METHODS,
    rounds: int = 15,
    block_s: float = 0.02,
    memory: dict[tuple[str, int, str], float] | None = None,
    threads: int = 1,
) -> list[Row]:
    """Median ms/step of every method, side by side per (model, batch), with ratios."""
    rows = []
    for name in models:
        for batch in batch_sizes:
            t0 = time.perf_counter()
            times = time_cell(
                name, batch, device, methods, rounds, block_s, clock_for(device, threads)
            )
            base = statistics.median(times[methods[0].name])
            for m in methods:
                med = statistics.median(times[m.name])
                peak = None if memory is None else memory.get((name, batch, m.name))
                rows.append(Row(name, batch, m.name, med * 1e3, med / base, m.target, peak))
            print(
                f"  measured {name} batch {batch} ({time.perf_counter() - t0:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    return rows


def scored(r: Row) -> bool:
    """Whether a row's target counts: batch clipping's is set for the 28x28 CNN; the CIFAR-10
    models' target is against Opacus (:func:`opacus_lines`), not against the plain step."""
    if r.model in ("cifar_cnn", "wrn16_4"):
        return False
    return not (r.method == "fedpriv batch clipping" and r.model != "tanh_cnn")


def format_table(rows: Sequence[Row], memory_method: str) -> str:
    """A Markdown table of the rows; a target is marked met/MISSED."""
    lines = [
        "| model | batch | step | ms/step | × non-private | target | peak MiB |",
        "|---|---:|---|---:|---:|---|---:|",
    ]
    for r in rows:
        target = (
            "" if r.target is None else f"≤{r.target}× {'met' if r.ratio <= r.target else 'MISSED'}"
        )
        if r.target is not None and not scored(r):
            target = f"({'met' if r.ratio <= r.target else 'over'} ≤{r.target}×, set for the CNN)"
        peak = "" if r.peak_mib is None else f"{r.peak_mib:.1f}"
        lines.append(
            f"| {r.model} | {r.batch} | {r.method} | {r.ms:.3f} | {r.ratio:.2f} | {target} "
            f"| {peak} |"
        )
    lines.append(f"\nPeak memory: {memory_method}.")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for every row")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256])
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), choices=list(MODELS))
    p.add_argument(
        "--augmult",
        type=int,
        default=0,
        help="K > 0: also time steps on K views per record (augmentation multiplicity)",
    )
    p.add_argument(
        "--rounds", type=int, default=15, help="interleaved timing rounds (samples per median)"
    )
    p.add_argument("--block-ms", type=float, default=20.0, help="target length of one timing block")
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory section")
    return p.parse_args(argv)


def run(args: argparse.Namespace, methods: Sequence[Method] = METHODS) -> list[Row]:
    """Memory section (first, before any timing, so CPU children fork a clean process), then
    steps."""
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    memory = None
    if not args.no_memory:
        t0 = time.perf_counter()
        memory = memory_section(args.models, args.batch_sizes, device, methods, args.threads)
        print(f"  memory section {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return step_section(
        args.models,
        args.batch_sizes,
        device,
        methods,
        args.rounds,
        args.block_ms / 1e3,
        memory,
        args.threads,
    )


def memory_method(device: torch.device) -> str:
    if device.type == "cuda":
        return "torch.cuda.max_memory_allocated above the allocation before the first of 3 steps"
    return (
        "ru_maxrss increase during the first step in a fresh forked child, "
        "from just before the first step"
    )


def opacus_lines(rows: Sequence[Row]) -> str:
    """fedpriv's DP-SGD step against the faster Opacus mode, per model and batch, measured in
    the same interleaved blocks (target: at most 1.0x)."""
    out = ["", "fedpriv DP-SGD step / the faster Opacus step (same model, batch; target <= 1.0x):"]
    cells = sorted({(r.model, r.batch) for r in rows})
    for model, batch in cells:
        ms = {r.method: r.ms for r in rows if (r.model, r.batch) == (model, batch)}
        ours = ms.get("fedpriv DP-SGD (fast path)")
        theirs = [ms[m] for m in ("Opacus hooks", "Opacus ghost clipping") if m in ms]
        if ours is None or not theirs:
            continue
        ratio = ours / min(theirs)
        verdict = "met" if ratio <= 1.0 else "MISSED"
        out.append(
            f"  {model} batch {batch}: {ours:.2f} / {min(theirs):.2f} ms = {ratio:.2f}x {verdict}"
        )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message="Full backward hook")  # Opacus on input layers
    t0 = time.perf_counter()
    print(
        f"# DP step benchmark: torch {torch.__version__}, device {args.device}, "
        f"torch.set_num_threads({args.threads}), noise_multiplier={NOISE_MULTIPLIER}, "
        f"max_grad_norm={MAX_GRAD_NORM}; "
        f"median of {args.rounds} interleaved blocks of ~{args.block_ms:g} ms; "
        f"clock: {clock_for(torch.device(args.device), args.threads).__name__}\n"
    )
    methods = METHODS + (augmult_methods(args.augmult) if args.augmult > 0 else ())
    rows = run(args, methods)
    print(
        format_table(
            rows, "skipped" if args.no_memory else memory_method(torch.device(args.device))
        )
    )
    counted = [r for r in rows if r.target is not None and scored(r)]
    missed = [r for r in counted if r.ratio > r.target]  # type: ignore[operator]
    print(opacus_lines(rows))
    print(
        f"\nTargets missed: {len(missed)} of {len(counted)} "
        "(batch clipping's 1.1x is set for the 28x28 CNN; the CIFAR-10 CNN's is vs Opacus); "
        f"total {time.perf_counter() - t0:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
