"""Batch clipping vs individual clipping at EQUAL ε: accuracy, σ, cost and group ε per row.

van Dijk et al., "Generalizing DP-SGD with Shuffling and Batch Clipping" (arXiv:2212.05796),
Algorithm 1 on MNIST: E epochs, a batch of B = 64 records per step split into m groups of
s = B/m records, each group's mini-batch gradient clipped to C and the sum noised with
N(0, (2Cσ)²). Rows: batch clipping with shuffling for m in 1, 4, 16, 64 (m = 64 is
individual clipping), individual clipping with subsampling (m = 64), and plain DP-SGD (the
literature's baseline: Poisson sampling at rate B / N, individual clipping, noise N(0, (Cσ)²),
the Poisson-subsampled Gaussian, add/remove), for each model and target ε. For every row σ is
calibrated to the target ε at δ = 1e-5 by the row's own privacy spec (the run's
``privacy.target_epsilon``: whatever analysis ``BatchClippingSpec`` defaults to for the
sampler); the table states that analysis and its neighbouring relation (the run's
``results.json`` ``privacy`` block) and, beside the σ used, the σ the first paper's f-DP
mixture (Sec. 5, ``sum_squares_law`` + ``calibrate_noise_multiplier``) needs at the same ε
("n/a (not covered)" for Poisson).

Protocol: the step size of each row is tuned on a validation split carved from the training
set (the last ``--val-size`` training images; tuning trains on the rest, seed 0; the grid
widens by half a decade while its best value is at an edge); the tuned step size then trains
on the whole training set with ``--seeds`` seeds, and the table gives test accuracy mean ±
SEM, σ, wall time per epoch, the peak memory of training, and ε for groups of g = 1, 2, 4, 8
records. The test set is used only for the reported accuracy.

Each run is the fedpriv client (``clients.generalized_dpsgd.GeneralizedDPSGD``, built from the
run plan that ``fedpriv.run.prepare.prepare`` makes of the Hydra config, one client) trained in
one process without Flower: the same ``train_client`` call as a Flower node, its events (its
``BatchClippingSpec``'s) composed by the run's ``RunPrivacy`` ledger. Plans cross process
boundaries as typed payloads (``RunPlan.to_payload``). Every run is validated (and σ
calibrated) before the first trains; ``runs.jsonl``, ``table.md``, ``table.json`` and
``equal_epsilon.png`` are rewritten after each run, and a rerun with the same ``--out`` skips
the runs already recorded. ``settings.json`` holds the settings of ``--out`` (epochs, batch,
sizes, overrides, the seeds asked for): a rerun with other settings, or whose rows calibrate
another σ than their recorded runs (another default analysis), is refused; a row whose
finals do not cover those seeds is marked unfinished in the table and left out of the plot.

Usage::

    .venv/bin/python scripts/get_full_mnist.py --out data/mnist-full     # once: 60k/10k files
    .venv/bin/python scripts/batch_clipping_equal_epsilon.py --data-dir data/mnist-full \
        --out outputs/bc_equal_epsilon [--models logistic tanh_cnn] [--epsilons 1 3 8] \
        [--rows shuffle:1 shuffle:4 shuffle:16 shuffle:64 subsample:64 poisson:64] \
        [--seeds 0 1 2] \
        [--jobs 2] [--epochs 10] [--batch 64] [--val-size 5000] [--train-size N]
    .venv/bin/python scripts/batch_clipping_equal_epsilon.py --render outputs/bc_equal_epsilon
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, replace
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedpriv.common.errors import ConfigError, check

if TYPE_CHECKING:
    from fedpriv.accounting.batch_clipping.spec import BatchClippingSpec
    from fedpriv.run.plan import RunPlan

GROUPS = (1, 2, 4, 8)
SAMPLERS = ("shuffle", "subsample", "poisson")
VARIANTS = ("shuffle:1", "shuffle:4", "shuffle:16", "shuffle:64", "subsample:64", "poisson:64")
#: Run settings a resumed ``--out`` must share (``settings.json``): they change every run.
SETTINGS = ("epochs", "batch", "val_size", "train_size", "overrides")
#: Step size per unit of m / σ at the centre of a row's first grid (the grid widens as needed),
#: σ of a noise N(0, (2Cσ)²): a row with another noise std per unit C is centred alike.
LR_SCALE = {"logistic": 1e-3, "tanh_cnn": 3e-4}
#: Steps run before the cost measurement starts (lazy initialisation, first allocations).
WARMUP_STEPS = 5
#: At most this many half-decades are added to a row's first grid.
MAX_WIDEN = 4


@dataclass(frozen=True)
class Row:
    """One table row: a model, a sampler with ``m`` groups of ``batch / m``, a target ε."""

    model: str
    sampler: str
    m: int
    s: int
    epsilon: float

    @property
    def label(self) -> str:
        kind = "individual" if self.s == 1 else "batch"
        return f"{self.sampler} m={self.m} ({kind} clipping)"


def parse_variant(text: str, batch: int) -> tuple[str, int]:
    """``"shuffle:4"`` -> ``("shuffle", 4)``; refuse a sampler or an m that does not divide B,
    and Poisson with groups (only individual clipping, m = B, has a Poisson analysis)."""
    sampler, _, m = text.partition(":")
    check(
        sampler in SAMPLERS and m.isdigit() and int(m) >= 1,
        "--rows",
        text,
        f"must be SAMPLER:M with SAMPLER {'|'.join(SAMPLERS)} and M an integer >= 1",
    )
    check(batch % int(m) == 0, "--rows", text, f"M must divide --batch {batch}")
    check(
        sampler != "poisson" or int(m) == batch,
        "--rows",
        text,
        f"M must be --batch {batch} with poisson (individual clipping)",
    )
    return sampler, int(m)


def overrides(args: argparse.Namespace, row: Row, split: str, lr: float, seed: int) -> list[str]:
    """Hydra overrides of one run; ``split`` is ``tune`` (train minus validation) or ``final``."""
    n = args.train_size - (args.val_size if split == "tune" else 0)
    client = "individual_clipping" if row.s == 1 else "batch_clipping"
    poisson = [  # rate B / N, the same expected batch; no group ε for Poisson
        f"privacy.sample_rate={row.m * row.s / n!r}",
        "privacy.group_sizes=null",
    ]
    return [
        "+experiment=batch_clipping_vs_dpsgd",
        f"client={client}",
        f"dataset.data_dir={args.data_dir}",
        f"dataset.options.train_limit={n}",
        f"model={row.model}",
        f"client.sampler={row.sampler}",
        f"client.num_groups={row.m}",
        f"client.group_size={row.s}",
        f"client.lr={lr}",
        "client.epochs=1",
        f"num_rounds={args.epochs}",
        f"seed={seed}",
        f"privacy.target_epsilon={row.epsilon}",
        "privacy.noise_multiplier=null",
        "progress=false",
        *(poisson if row.sampler == "poisson" else []),
        *args.overrides,
    ]


def prepared(args: argparse.Namespace, row: Row, split: str, lr: float, seed: int) -> RunPlan:
    """The plan of one run (validated, σ calibrated) by ``fedpriv.run.prepare``."""
    from fedpriv.run.config import compose_config
    from fedpriv.run.prepare import prepare

    return prepare(compose_config(overrides(args, row, split, lr, seed)))[0]


def train_size(args: argparse.Namespace) -> int:
    """Training images available (``--train-size`` checked against the data)."""
    from fedpriv.data.images import load_mnist

    available = len(load_mnist(args.data_dir).y_train)
    n = available if args.train_size is None else args.train_size
    check(1 <= n <= available, "--train-size", n, f"must be in [1, {available}]")
    check(1 <= args.val_size < n, "--val-size", args.val_size, f"must be in [1, {n - 1}]")
    return n


def plan(args: argparse.Namespace) -> dict[Row, dict[str, RunPlan]]:
    """Every row's tuning and final config, validated and calibrated before anything trains.

    Raises
    ------
    ConfigError
        On the first bad value, naming its field (a flag or a config key).
    """
    check(args.epochs >= 1, "--epochs", args.epochs, "must be >= 1")
    check(args.jobs >= 1, "--jobs", args.jobs, "must be >= 1")
    check(args.cost_steps >= 1, "--cost-steps", args.cost_steps, "must be >= 1")
    check(args.seeds != [], "--seeds", args.seeds, "must name at least one seed")
    for eps in args.epsilons:
        check(0 < eps < math.inf, "--epsilons", eps, "must be finite numbers > 0")
    for model in args.models:
        check(model in LR_SCALE, "--models", model, f"must be among {sorted(LR_SCALE)}")
    args.train_size = train_size(args)
    variants = [parse_variant(v, args.batch) for v in args.variants]
    b = args.batch
    rows = [
        Row(mo, s, m, b // m, e) for mo in args.models for e in args.epsilons for s, m in variants
    ]
    return {r: {sp: prepared(args, r, sp, 1.0, 0) for sp in ("tune", "final")} for r in rows}


def batch_spec(spec: Any) -> BatchClippingSpec:
    """A plan's or client's privacy spec, typed (every row's client holds a
    ``BatchClippingSpec``)."""
    from fedpriv.accounting.batch_clipping.spec import BatchClippingSpec

    assert isinstance(spec, BatchClippingSpec), type(spec)
    return spec


def paper_sigma(plan: RunPlan) -> float | None:
    """σ the first paper's f-DP mixture needs for the plan's target ε over its whole run
    (``sum_squares_law`` + ``calibrate_noise_multiplier``), whatever analysis the spec
    defaults to; ``None`` for Poisson sampling, which that analysis does not cover."""
    from fedpriv.accounting.batch_clipping.spec import calibrate_noise_multiplier
    from fedpriv.accounting.samplers.batch_groups import sum_squares_law

    spec = batch_spec(plan.privacy)
    if spec.is_poisson:
        return None
    rounds = plan.num_rounds * spec.rounds_per_server_round
    law = sum_squares_law(
        spec.sampler.value, spec.samples_used, spec.num_groups, spec.group_size, rounds
    )
    target = spec.calibrated_from_target_epsilon
    assert target is not None, "every row's σ is calibrated to its target ε"
    return calibrate_noise_multiplier(law, target, spec.target_delta)


def paper_sigmas(rows: dict[Row, dict[str, RunPlan]]) -> dict[Row, float | None]:
    """:func:`paper_sigma` of every row's final config."""
    return {row: paper_sigma(cfgs["final"]) for row, cfgs in rows.items()}


def lr_grid(row: Row, noise: float, width: int) -> list[float]:
    """``width`` step sizes half a decade apart around ``LR_SCALE * m / σ``, with ``σ`` =
    ``noise / 2`` (``noise``: the noise std per unit clipping norm, ``2σ`` for fixed-size
    batches, ``σ`` for Poisson)."""
    k = round(2 * math.log10(LR_SCALE[row.model] * row.m * 2 / noise))
    return [half_decade(k + i - width // 2) for i in range(width)]


def half_decade(k: int) -> float:
    """``10^(k/2)`` to 3 significant digits (1, 3.16, 10, ...)."""
    return float(f"{10 ** (k / 2):.3g}")


def widen(results: dict[float, float]) -> float | None:
    """The next step size to try, or ``None`` when the best is inside the grid."""
    lrs = sorted(results)
    best = max(lrs, key=lambda lr: results[lr])
    k = round(2 * math.log10(best))
    if best == lrs[0]:
        return half_decade(k - 1)
    if best == lrs[-1]:
        return half_decade(k + 1)
    return None


@dataclass(frozen=True)
class Run:
    """One training run of a row."""

    row: Row
    split: str
    lr: float
    seed: int

    def key(self) -> str:
        return json.dumps([asdict(self.row), self.split, self.lr, self.seed])


def with_run(plan: RunPlan, run: Run) -> RunPlan:
    """The row's plan with this run's step size and seed (neither changes the privacy spec:
    one client holding the whole training set, σ calibrated once per row)."""
    return replace(plan, seed=run.seed, client={**plan.client, "lr": run.lr})


class Schedule:
    """Which run comes next: finals of tuned rows first, then tuning, rows in order.

    A row's tuning trains ``width`` step sizes (less those in ``known``, the validation
    accuracies already recorded, which count too); while the best is at an edge it adds the
    next half-decade (:func:`widen`); then its finals train the best step size on every seed.
    """

    def __init__(
        self,
        rows: dict[Row, dict[str, RunPlan]],
        seeds: list[int],
        width: int,
        known: dict[Row, dict[float, float]] | None = None,
    ) -> None:
        self.rows, self.seeds, self.width = rows, seeds, width
        self.todo: list[Run] = []
        self.tuned = {r: dict((known or {}).get(r, {})) for r in rows}
        self.waiting: dict[Row, int] = {}
        for r, cfgs in rows.items():
            grid = lr_grid(r, batch_spec(cfgs["tune"].privacy).noise_stddev(1.0), width)
            new = [lr for lr in grid if lr not in self.tuned[r]]
            self.todo += [Run(r, "tune", lr, 0) for lr in new]
            self.waiting[r] = len(new)
            if not new:
                self._decide(r)

    def next(self) -> Run | None:
        """The next run to start (finals before tuning), or ``None`` for now."""
        finals = [i for i, run in enumerate(self.todo) if run.split == "final"]
        return self.todo.pop(finals[0] if finals else 0) if self.todo else None

    def finish(self, run: Run, result: dict[str, Any]) -> None:
        """Record a finished run; once a row's step sizes are in, :meth:`_decide`."""
        if run.split != "tune":
            return
        self.tuned[run.row][run.lr] = result["accuracy"]
        self.waiting[run.row] -= 1
        if not self.waiting[run.row]:
            self._decide(run.row)

    def _decide(self, row: Row) -> None:
        """Schedule a widening step, or the finals at the best step size."""
        tuned = self.tuned[row]
        nxt = widen(tuned)
        if nxt is not None and len(tuned) < self.width + MAX_WIDEN:
            self.todo.insert(0, Run(row, "tune", nxt, 0))
            self.waiting[row] = 1
            return
        best = max(tuned, key=lambda lr: tuned[lr])
        self.todo += [Run(row, "final", best, s) for s in self.seeds]

    def config(self, run: Run) -> RunPlan:
        return with_run(self.rows[run.row][run.split], run)


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)


def _rss_kib(field: str) -> int | None:
    """``VmRSS`` / ``VmHWM`` of this process in KiB (Linux), else ``None``."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak_memory(device: Any) -> int | None:
    """Start measuring the peak: CUDA's allocator statistics, else the process's peak RSS
    (``VmHWM``, reset through ``/proc/self/clear_refs`` after ``malloc_trim``); the baseline
    in bytes."""
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return int(torch.cuda.memory_allocated(device))
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    rss = _rss_kib("VmRSS")
    return None if rss is None else rss * 1024


def peak_memory_mib(device: Any, baseline: int | None) -> float | None:
    """Peak memory above ``baseline`` since :func:`reset_peak_memory`, in MiB."""
    import torch

    if baseline is None:
        return None
    if device.type == "cuda":
        return (torch.cuda.max_memory_allocated(device) - baseline) / 2**20
    hwm = _rss_kib("VmHWM")
    return None if hwm is None else (hwm * 1024 - baseline) / 2**20


def eval_split(plan: RunPlan, split: str, val_size: int) -> tuple[Any, Any]:
    """Validation images (the ``val_size`` training images after the tuning set) or the
    official test set, standardized like the training images."""
    from fedpriv.data.images import load_mnist

    ds = load_mnist(plan.dataset.data_dir)
    if split == "final":
        return ds.x_test, ds.y_test
    n = int(plan.dataset.options["train_limit"])
    return ds.x_train[n : n + val_size], ds.y_train[n : n + val_size]


def client_setup(plan: RunPlan) -> tuple[Any, Any, Any]:
    """The run's device, client 0's data (the whole training set) and the seeded model."""
    import torch

    from fedpriv.data.client_data import ClientData
    from fedpriv.run.setup import build_model_for, client_partition, resolve_device

    device = resolve_device(plan)
    x, y = client_partition(plan, 0)
    data = ClientData(torch.from_numpy(x), torch.from_numpy(y), 0)
    return device, data, build_model_for(plan).to(device)


def train_one(plan_json: str, split: str, val_size: int) -> dict[str, Any]:
    """Train one run (its plan's payload) as its Flower client would (one client,
    ``num_rounds`` server rounds of one epoch); its accuracy on the split's evaluation set, ε
    from the run's ledger, group ε (the spec's report), wall time per epoch (s) and peak
    training memory (MiB)."""
    import time

    from fedpriv.models.evaluate import evaluate
    from fedpriv.run import client_app
    from fedpriv.run.plan import RunPlan
    from fedpriv.run.run_privacy import RunPrivacy
    from fedpriv.run.setup import build_algorithm

    plan = RunPlan.from_payload(plan_json)
    algorithm = build_algorithm(plan)
    device, data, model = client_setup(plan)
    privacy = RunPrivacy(algorithm.privacy, 1)
    privacy.check()
    baseline = reset_peak_memory(device)
    t0 = time.perf_counter()
    for server_round in range(1, plan.num_rounds + 1):
        # One client, FedAvg with server_lr 1: the global model is the client's end model.
        client_app.train_client(plan, algorithm, model, data, server_round)
        privacy.record_round(contributors=1, server_round=server_round)
    wall = (time.perf_counter() - t0) / plan.num_rounds
    peak = peak_memory_mib(device, baseline)
    accuracy, _ = evaluate(model, *eval_split(plan, split, val_size))
    return {
        "accuracy": accuracy,
        "epsilon": privacy.epsilon(),
        **algorithm.privacy.report(privacy.rounds),
        **analysis_of(algorithm.privacy),
        "sigma": batch_spec(algorithm.privacy).sigma,
        "wall_s_per_epoch": wall,
        "peak_mib": peak,
        "device": device.type,
    }


def analysis_of(spec: Any) -> dict[str, Any]:
    """``analysis``, ``neighboring_relation`` and ``accounting`` of the run's ``results.json``
    ``privacy`` block (the spec's summary: whatever analysis its family defaults to)."""
    summary = spec.summary()
    return {k: summary.get(k) for k in ("analysis", "neighboring_relation", "accounting")}


def measure_cost(plan_json: str, steps: int) -> dict[str, Any]:
    """Time ``steps`` local rounds of the row's client alone (its plan's payload) and its peak
    memory: seconds per epoch (``N // (m s)`` rounds), milliseconds per step, MiB above the
    baseline."""
    import time

    from fedpriv.run import client_app
    from fedpriv.run.plan import RunPlan
    from fedpriv.run.setup import build_algorithm

    plan = RunPlan.from_payload(plan_json)
    per_epoch = batch_spec(build_algorithm(plan).privacy).rounds_per_epoch
    device, data, model = client_setup(plan)
    runs = []
    for n in (WARMUP_STEPS, steps):  # the first steps pay one-time set-up: not measured
        run_plan = replace(plan, client={**plan.client, "epochs": None, "local_rounds": n})
        runs.append((run_plan, build_algorithm(run_plan)))
    client_app.train_client(runs[0][0], runs[0][1], model, data, 1)
    baseline = reset_peak_memory(device)
    t0 = time.perf_counter()
    client_app.train_client(runs[1][0], runs[1][1], model, data, 1)
    step = (time.perf_counter() - t0) / steps
    return {
        "s_per_epoch": step * per_epoch,
        "ms_per_step": 1e3 * step,
        "peak_mib": peak_memory_mib(device, baseline),
        "device": device.type,
    }


def measure_costs(args: argparse.Namespace, rows: dict[Row, dict[str, RunPlan]]) -> None:
    """One :func:`measure_cost` per (model, sampler, m), each alone in a fresh process,
    appended to ``costs.jsonl`` (already measured ones are kept)."""
    known = {json.dumps(c["variant"]) for c in load_jsonl(args.out / "costs.jsonl")}
    todo = {}
    for row, cfgs in rows.items():
        variant = {"model": row.model, "sampler": row.sampler, "m": row.m, "s": row.s}
        if json.dumps(variant) not in known:
            todo[json.dumps(variant)] = (variant, cfgs["final"])
    ctx = get_context("spawn")
    for variant, cfg in todo.values():
        with ProcessPoolExecutor(1, mp_context=ctx, initializer=_init_worker) as pool:
            cost = pool.submit(measure_cost, cfg.to_payload(), args.cost_steps).result()
        with (args.out / "costs.jsonl").open("a") as f:
            f.write(json.dumps({"variant": variant, "steps": args.cost_steps, **cost}) + "\n")
        print(f"cost {variant}: {cost['ms_per_step']:.2f} ms/step", flush=True)


def summarize(
    records: list[dict[str, Any]],
    costs: Sequence[dict[str, Any]] = (),
    seeds: Sequence[int] | None = None,
) -> list[dict[str, Any]]:
    """One entry per row (:func:`row_order`): tuned step size (best validation accuracy),
    test accuracy mean and SEM over the finals at it, σ, time, memory and group ε, and
    ``complete``: its finals cover ``seeds`` (default: every seed of any final recorded)."""
    if seeds is None:
        seeds = sorted({rec["seed"] for rec in records if rec["split"] == "final"})
    rows: dict[str, dict[str, Any]] = {}
    for rec in records:
        entry = rows.setdefault(
            json.dumps(rec["row"]), {"row": rec["row"], "tune": {}, "final": []}
        )
        if rec["split"] == "tune":
            entry["tune"][rec["lr"]] = rec["result"]["accuracy"]
        else:
            entry["final"].append(rec)
    out = []
    for entry in sorted(rows.values(), key=lambda e: row_order(e["row"])):
        best = max(entry["tune"], key=lambda lr: entry["tune"][lr]) if entry["tune"] else None
        finals = [r for r in entry["final"] if r["lr"] == best]
        out.append(
            {
                "row": entry["row"],
                "lr": best,
                "grid": sorted(entry["tune"]),
                "val_accuracy": entry["tune"].get(best),
                **final_stats(finals),
                "seeds_expected": len(seeds),
                "complete": bool(finals) and set(seeds) <= {r["seed"] for r in finals},
                "cost": cost_of(entry["row"], costs),
            }
        )
    return out


def cost_of(row: dict[str, Any], costs: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The cost measurement of the row's (model, sampler, m, s), if made."""
    keys = ("model", "sampler", "m", "s")
    found = [c for c in costs if all(c["variant"][k] == row[k] for k in keys)]
    return found[-1] if found else None


def row_order(row: dict[str, Any]) -> tuple[Any, ...]:
    """Table order: model, ε, shuffling, subsampling, Poisson, m."""
    return (row["model"] != "logistic", row["epsilon"], SAMPLERS.index(row["sampler"]), row["m"])


def final_stats(finals: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean ± SEM of the finals' test accuracy, mean time, max memory, the (seed-free) ε."""
    if not finals:
        return {"seeds": 0}
    acc = [f["result"]["accuracy"] for f in finals]
    mean = sum(acc) / len(acc)
    sem = (
        math.sqrt(sum((a - mean) ** 2 for a in acc) / (len(acc) - 1) / len(acc))
        if len(acc) > 1
        else float("nan")
    )
    res = finals[0]["result"]
    peaks = [f["result"]["peak_mib"] for f in finals if f["result"]["peak_mib"] is not None]
    return {
        "seeds": len(acc),
        "accuracy": mean,
        "sem": sem,
        "sigma": res["sigma"],
        "paper_sigma": finals[0].get("paper_sigma", math.nan),  # NaN: not recorded
        "analysis": res.get("analysis"),
        "neighboring_relation": res.get("neighboring_relation"),
        "wall_s_per_epoch": sum(f["result"]["wall_s_per_epoch"] for f in finals) / len(finals),
        "peak_mib": max(peaks) if peaks else None,
        **{f"epsilon_g{g}": res.get(f"epsilon_g{g}") for g in GROUPS},
    }


def format_table(summary: list[dict[str, Any]]) -> str:
    """Markdown table of :func:`summarize`'s entries (an unfinished row says so)."""
    head = (
        "| model | sampler, m groups × s | target ε | analysis (relation) | σ | "
        "σ (paper's analysis) | tuned η (grid) | val. acc. | test acc. (mean ± SEM, seeds) | "
        "s / epoch | peak MiB | " + " | ".join(f"ε g={g}" for g in GROUPS) + " |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for e in summary:
        r = e["row"]
        cells = [r["model"], f"{r['sampler']}, {r['m']} × {r['s']}", f"{r['epsilon']:g}"]
        if not e["seeds"]:
            lines.append("| " + " | ".join(cells) + " | tuning (unfinished) ... |")
            continue
        wall, peak = cost_cells(e)
        cells += [
            f"{e['analysis'] or '—'} ({e['neighboring_relation'] or '—'})",
            f"{e['sigma']:.3f}",
            paper_sigma_cell(e["paper_sigma"]),
            f"{e['lr']:g} ({e['grid'][0]:g}–{e['grid'][-1]:g})",
            f"{100 * e['val_accuracy']:.1f}%",
            f"{100 * e['accuracy']:.1f} ± {100 * e['sem']:.1f}% {seeds_cell(e)}",
            wall,
            peak,
        ]
        cells += [number_cell(e[f"epsilon_g{g}"]) for g in GROUPS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def seeds_cell(e: dict[str, Any]) -> str:
    """``(3)``, or ``(1 of 3 seeds: unfinished)`` for a row whose finals are not all in."""
    if e["complete"]:
        return f"({e['seeds']})"
    return f"({e['seeds']} of {e['seeds_expected']} seeds: unfinished)"


def paper_sigma_cell(sigma: float | None) -> str:
    """The paper's σ; ``n/a (not covered)`` for Poisson (``None``), ``—`` if not recorded."""
    if sigma is None:
        return "n/a (not covered)"
    return number_cell(sigma, ".3f")


def number_cell(x: float | None, fmt: str = ".2f") -> str:
    """``x`` formatted, ``—`` for ``None`` or NaN (not computed)."""
    return "—" if x is None or math.isnan(x) else format(x, fmt)


def cost_cells(e: dict[str, Any]) -> tuple[str, str]:
    """Seconds per epoch and peak MiB: the lone-process measurement (:func:`measure_cost`),
    else the training runs' own (marked †: other runs shared the CPU)."""
    cost = e.get("cost")
    if cost:
        wall, peak, mark = cost["s_per_epoch"], cost["peak_mib"], ""
    else:
        wall, peak, mark = e["wall_s_per_epoch"], e["peak_mib"], "†"
    return f"{wall:.3g}{mark}", ("—" if peak is None else f"{peak:.1f}{mark}")


def line_label(row: dict[str, Any]) -> str:
    """``shuffle m=4`` / ``subsample m=64``."""
    return f"{row['sampler']} m={row['m']}"


def plot(summary: list[dict[str, Any]], path: Path) -> None:
    """Test accuracy against ε, one line per (sampler, m), one panel per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [e for e in summary if e["complete"]]
    models = sorted({e["row"]["model"] for e in done})
    if not models:
        return
    by_m = sorted(done, key=lambda e: (SAMPLERS.index(e["row"]["sampler"]), e["row"]["m"]))
    labels = list(dict.fromkeys(line_label(e["row"]) for e in by_m))
    colors = {label: f"C{i}" for i, label in enumerate(labels)}  # the same colour in each panel
    epsilons = sorted({e["row"]["epsilon"] for e in done})
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.8), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        lines: dict[str, list[dict[str, Any]]] = {}
        for e in done:
            if e["row"]["model"] == model:
                lines.setdefault(line_label(e["row"]), []).append(e)
        for label, pts in lines.items():
            pts.sort(key=lambda e: e["row"]["epsilon"])
            ax.errorbar(
                [p["row"]["epsilon"] for p in pts],
                [100 * p["accuracy"] for p in pts],
                yerr=[100 * (0 if math.isnan(p["sem"]) else p["sem"]) for p in pts],
                marker="o",
                capsize=3,
                label=label,
                color=colors[label],
            )
        ax.set(xscale="log", xlabel="ε (δ = 1e-5)", ylabel="test accuracy (%)", title=model)
        ax.set_xticks(epsilons, [f"{x:g}" for x in epsilons])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def load_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (a line cut by a killed run is skipped)."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def load_settings(out: Path) -> dict[str, Any]:
    """``settings.json`` of ``out`` (``{}`` if none: made before it existed, or new)."""
    path = out / "settings.json"
    return dict(json.loads(path.read_text())) if path.is_file() else {}


def check_resumable(
    args: argparse.Namespace, rows: dict[Row, dict[str, RunPlan]], records: list[dict[str, Any]]
) -> None:
    """Refuse to add runs to an ``--out`` made with other :data:`SETTINGS`, or holding runs of
    a planned row at another σ (another default analysis, say): they would mix unmarked.

    Raises
    ------
    ConfigError
        Naming the differing setting (or ``--out``) and its value.
    """
    old = load_settings(args.out)
    for key in SETTINGS:
        flag = key if key == "overrides" else "--" + key.replace("_", "-")
        new = getattr(args, key)
        check(
            old.get(key, new) == new,
            flag,
            new,
            f"differs from {old.get(key)!r}, the value --out {args.out} was made with: "
            "use another --out",
        )
    for rec in records:
        row = Row(**rec["row"])
        if row not in rows:
            continue
        got, want = rec["result"]["sigma"], batch_spec(rows[row][rec["split"]].privacy).sigma
        check(
            math.isclose(got, want, rel_tol=1e-6),
            "--out",
            str(args.out),
            f"holds {row.model} {row.label} ε={row.epsilon:g} runs at σ={got:.4f} where this "
            f"plan calibrates σ={want:.4f} (another analysis or setting): use another --out",
        )


def write_settings(args: argparse.Namespace) -> None:
    """Record :data:`SETTINGS` and the seeds asked for so far (their union: the seeds every
    row's finals must cover to count as finished) in ``settings.json``."""
    seeds = sorted(set(load_settings(args.out).get("seeds", [])) | set(args.seeds))
    settings = {key: getattr(args, key) for key in SETTINGS} | {"seeds": seeds}
    (args.out / "settings.json").write_text(json.dumps(settings, indent=2) + "\n")


def save(out: Path) -> str:
    """Rewrite ``table.md``, ``table.json`` and ``equal_epsilon.png`` from ``runs.jsonl`` and
    ``costs.jsonl`` (rows finished against the seeds of ``settings.json``); return the table."""
    runs, costs = load_jsonl(out / "runs.jsonl"), load_jsonl(out / "costs.jsonl")
    summary = summarize(runs, costs, load_settings(out).get("seeds"))
    table = format_table(summary)
    (out / "table.md").write_text(table + "\n")
    (out / "table.json").write_text(json.dumps(summary, indent=2))
    plot(summary, out / "equal_epsilon.png")
    return table


def execute(
    args: argparse.Namespace,
    rows: dict[Row, dict[str, RunPlan]],
    paper: dict[Row, float | None],
) -> list[dict[str, Any]]:
    """Train every run (``--jobs`` processes), appending each to ``runs.jsonl`` (finals with
    the row's ``paper`` σ) and rewriting the table as it finishes; runs already in
    ``runs.jsonl`` are not trained again."""
    records = load_jsonl(args.out / "runs.jsonl")
    done = {rec["key"]: rec for rec in records}
    known: dict[Row, dict[float, float]] = {}
    for old in records:
        if old["split"] == "tune":
            known.setdefault(Row(**old["row"]), {})[old["lr"]] = old["result"]["accuracy"]
    sched = Schedule(rows, args.seeds, args.grid, known)
    pending: dict[Future[dict[str, Any]], Run] = {}
    ctx = get_context("spawn")
    with ProcessPoolExecutor(args.jobs, mp_context=ctx, initializer=_init_worker) as pool:
        while True:
            while len(pending) < args.jobs and (run := sched.next()) is not None:
                if run.key() in done:  # a final already recorded
                    continue
                plan_json = sched.config(run).to_payload()
                fut = pool.submit(train_one, plan_json, run.split, args.val_size)
                pending[fut] = run
            if not pending:
                return records
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                run = pending.pop(fut)
                rec = run_record(run, fut.result(), paper[run.row])
                with (args.out / "runs.jsonl").open("a") as f:
                    f.write(json.dumps(rec) + "\n")
                records.append(rec)
                sched.finish(run, rec["result"])
                save(args.out)
                print(progress_line(rec), flush=True)


def run_record(run: Run, result: dict[str, Any], paper: float | None) -> dict[str, Any]:
    """The ``runs.jsonl`` line of a finished run; a final holds its row's ``paper_sigma``."""
    rec: dict[str, Any] = {
        "key": run.key(),
        "row": asdict(run.row),
        "split": run.split,
        "lr": run.lr,
        "seed": run.seed,
        "result": result,
    }
    if run.split == "final":
        rec["paper_sigma"] = paper
    return rec


def progress_line(rec: dict[str, Any]) -> str:
    r, res = rec["row"], rec["result"]
    return (
        f"{r['model']} {r['sampler']} m={r['m']} ε={r['epsilon']:g} {rec['split']} "
        f"η={rec['lr']:g} seed={rec['seed']}: acc {100 * res['accuracy']:.1f}% "
        f"σ={res['sigma']:.3f} ε={res['epsilon']:.3f} {res['wall_s_per_epoch']:.1f} s/epoch"
    )


def plan_line(row: Row, final: RunPlan, paper: float | None) -> str:
    """A row's calibrated σ, its analysis and relation, and the paper's σ."""
    facts = analysis_of(final.privacy)
    return (
        f"{row.model} {row.label} ε={row.epsilon:g}: σ = {batch_spec(final.privacy).sigma:.3f} "
        f"({facts['analysis']}, {facts['neighboring_relation']}), paper's analysis: "
        f"{paper_sigma_cell(paper)}"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--data-dir", default="data/mnist-full", help="the four MNIST IDX files")
    ap.add_argument("--out", type=Path, default=Path("outputs/bc_equal_epsilon"))
    ap.add_argument("--models", nargs="+", default=["logistic", "tanh_cnn"])
    ap.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 3.0, 8.0])
    ap.add_argument(
        "--rows",
        "--variants",
        dest="variants",
        nargs="+",
        default=list(VARIANTS),
        help="SAMPLER:M rows (SAMPLER shuffle|subsample|poisson)",
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64, help="records per step, m × s")
    ap.add_argument("--val-size", type=int, default=5000)
    ap.add_argument("--train-size", type=int, help="first N training images (default: all)")
    ap.add_argument("--grid", type=int, default=3, help="step sizes in a row's first grid")
    ap.add_argument("--jobs", type=int, default=1, help="training processes")
    ap.add_argument("--cost-steps", type=int, default=300, help="steps timed per variant")
    ap.add_argument("--validate-only", action="store_true", help="plan and calibrate, no runs")
    ap.add_argument("--cost-only", action="store_true", help="measure costs, train nothing")
    ap.add_argument("--render", type=Path, help="only rewrite the table of a saved --out")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run (after --)")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        print(save(args.render))
        return 0
    try:
        check(args.grid >= 2, "--grid", args.grid, "must be >= 2")
        rows = plan(args)
        paper = paper_sigmas(rows)
        check_resumable(args, rows, load_jsonl(args.out / "runs.jsonl"))
    except ConfigError as exc:
        print(f"batch_clipping_equal_epsilon: error: {exc}", file=sys.stderr)
        return 2
    for row, cfgs in rows.items():
        print(plan_line(row, cfgs["final"], paper[row]), flush=True)
    if args.validate_only:
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    write_settings(args)
    if not args.cost_only:
        execute(args, rows, paper)
    measure_costs(args, rows)
    print(save(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
