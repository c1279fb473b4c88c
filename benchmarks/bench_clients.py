"""fedpriv at cross-device scale against the compute floor, measured side by side in one run.

``make bench`` runs the default (about 1-3 minutes on 2 cores)::

    python benchmarks/bench_clients.py                   # N = 1,000 + 10^5 registered / 10^3
    python benchmarks/bench_clients.py --clients 1000 10000
    python benchmarks/bench_clients.py --registered 100000 --sampled 1000 --clients
    python benchmarks/bench_clients.py --no-cohort vmap_clients=true   # extra Hydra overrides

Workloads (the peer benchmark's, ``../shared/bench/peer-pfl/run_fedpriv.py``): logistic
regression 784 -> 10 from fedpriv's seed-0 weights, FedAvg, one full-batch SGD step per client
(lr 0.1; ``privacy.sample_rate=1`` so the DP-SGD batch is the whole local data and the step
divides the summed gradients by its size; ``privacy.max_grad_norm=1e6``: nothing clipped;
``privacy.noise_multiplier=0``: no noise; NON-PRIVATE, as the engine alone is compared),
server lr 1, IID split with seed 0, ``ray_init_args.num_cpus=2`` (``--cpus``) and
``client_resources.num_cpus=1`` (``--client-cpus``):

peer, N clients (``--clients N ...``; default 1000)
    every client trains every round. Data: the 6,000 embedded Fashion-MNIST training images
    for N <= 6,000; beyond, those 6,000 followed by N - 6,000 of them drawn with replacement
    (``numpy.random.default_rng(12345).integers(0, 6000, N - 6000)``), written as IDX files in
    a temp dir and read by ``dataset.name=fashion_mnist`` (for N = 10,000 exactly the peer
    harness's ``make_data.py`` set); test: the 1,000 embedded test images.
cohort, R registered, K sampled (``--registered R --sampled K``; default 10^5 and 10^3)
    ``client_sampling=fixed_size num_sampled_clients=K`` out of ``num_clients=R``; data built
    as above with R rows (10^5: the 6,000 embedded images and 94,000 redrawn, one per
    client). ``--no-cohort`` skips it.

What is printed, per workload
-----------------------------
fedpriv s/round
    median of ``round_time_s`` (results.json: send, clients, replies, sum, server step) over
    the rounds after the first (the first starts the actors); ``--rounds`` (default 4).
floor s/round
    the same round in a plain torch loop, one thread, in this process: for each client of the
    round's cohort (the run's own data, split and cohorts), copy the global weights into the
    model, forward on the client's data, mean cross-entropy, backward, SGD step, add the delta
    to a running sum; then the server step (as ``peer-pfl/floor_plain.py``). Median of
    ``--floor-reps`` rounds (default 5, after a warm-up round) measured just BEFORE and again
    just AFTER the fedpriv run; the lower of the two medians is the floor (load from other
    jobs only slows a measurement, and a slow floor would flatter fedpriv).
ratio
    fedpriv / floor (target <= 1.5). fedpriv has ``--cpus`` cores; the floor has one.
accuracy check
    test accuracy after each round, fedpriv and the plain loop from the same start: equal up
    to float summation order means the work is the same.
peak memory
    the largest sample, every 0.25 s during the fedpriv run, of Σ PSS over this process and
    every descendant (Ray's GCS, raylet, workers, actors; each shared page split between its
    users; target <= 2 GiB) and of Σ RSS (over-counts shared pages); also the peak Σ PSS
    between the end of round 1 and the end of the last round (steady state: start-up,
    including every process's data loading, left out).
against the plain loop as a process
    the same rounds run by ``floor_process.py`` in a fresh interpreter that imports only numpy
    and torch (logistic workloads): its start-up + shut-down (wall time outside its rounds,
    interpreter start included), its peak Σ PSS and its whole wall time, each beside
    fedpriv's and as the ratio fedpriv / plain process. fedpriv's start-up and wall time add
    the seconds a fresh interpreter takes to import fedpriv's runner (the bench has it loaded).
    pfl, where installed, is the other baseline (``../shared/bench/peer-pfl/``).
load
    ``os.getloadavg()`` (as ``uptime``) before and after: the machine is shared.
``vmap_clients``
    the value the run used when the config has that key (``absent`` otherwise).

Options: ``--clients N ...`` (none: peer workload skipped), ``--registered``, ``--sampled``,
``--no-cohort``, ``--rounds``, ``--floor-reps``, ``--cpus``, ``--client-cpus``, ``--json FILE``
(all figures), ``--pull-interval S`` and ``--indexed-linkstate`` (Flower experiments, below);
positional arguments are extra Hydra overrides for every run. Exit status 1 if a run did not
complete.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import gzip
import json
import logging
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from floor_process import plain_round, run_floor_process, write_workload  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")
GIB = 1024**3
EMBEDDED_ROWS = 6000
EXTRA_SEED = 12345  # the peer harness's make_data.py

#: The peer workload (``peer-pfl/run_fedpriv.py``); ``num_clients`` etc. are added per run.
PEER_OVERRIDES = [
    "model=logistic",
    "client.steps=1",
    "client.lr=0.1",
    "strategy.server_lr=1.0",
    "privacy.noise_multiplier=0",
    "privacy.max_grad_norm=1e6",
    "privacy.sample_rate=1.0",
    "partition=iid",
    "seed=0",
    "progress=false",
    "plot=false",
    "save_model=false",
    "round_timeout=3600",
]


def descendants(root: int) -> list[int]:
    """``root`` and every process below it (from ``/proc/*/stat``)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def tree_memory(root: int) -> tuple[int, int, int]:
    """``(Σ RSS bytes, Σ PSS bytes, number of processes)`` of the tree under ``root``."""
    rss = pss = n = 0
    for pid in descendants(root):
        try:
            with open(f"/proc/{pid}/statm") as f:
                rss += int(f.read().split()[1]) * PAGE
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
                        break
            n += 1
        except OSError:
            continue
    return rss, pss, n


class MemorySampler(threading.Thread):
    """Samples :func:`tree_memory` of this process every ``interval`` s; keeps the peaks."""

    def __init__(self, interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.peak_rss = self.peak_pss = self.peak_procs = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            rss, pss, n = tree_memory(os.getpid())
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
            self.peak_procs = max(self.peak_procs, n)
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def compose(overrides: list[str]) -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from fedpriv.run.config import conf_dir, register_schema

    register_schema()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides)


def set_pull_interval(seconds: float) -> None:
    """Make every ``InMemoryGrid`` of this process poll for replies every ``seconds`` (the
    public ``pull_interval`` attribute, set at construction)."""
    from flwr.superlink.grid import InMemoryGrid

    init = InMemoryGrid.__init__

    def patched(self: InMemoryGrid, state_factory: Any, pull_interval: float = seconds) -> None:
        init(self, state_factory, pull_interval=seconds)

    InMemoryGrid.__init__ = patched  # type: ignore[method-assign]


def index_linkstate_by_node() -> None:
    """EXPERIMENT (``--indexed-linkstate``; no fedpriv run uses it): give flwr 1.42's
    ``InMemoryLinkState.get_message_ins`` a per-node index of message ids.

    Flower's simulation engine polls ``get_message_ins(node_id, limit=1)`` for every node
    every 0.1 s (``vce_api.add_messages_to_queue``) and each call scans every stored message
    with ``_check_stored_messages``: O(nodes × messages) per poll. With the index a call only
    looks at its own node's messages; what it returns is unchanged (same checks, same order).
    """
    from collections import defaultdict

    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState, now

    store = InMemoryLinkState.store_message_ins

    def store_indexed(self: Any, message: Any) -> Any:
        msg_id = store(self, message)
        if msg_id:
            with self.lock:
                self.__dict__.setdefault("_by_node", defaultdict(list))[
                    message.metadata.dst_node_id
                ].append(msg_id)
        return msg_id

    def get_indexed(
        self: Any, node_id: int, limit: int | None, *, run_id: int | None = None
    ) -> list[Any]:
        if limit is not None and limit < 1:
            raise AssertionError("`limit` must be >= 1")
        found: list[Any] = []
        with self.lock:
            index = self.__dict__.setdefault("_by_node", defaultdict(list))
            alive = []
            for msg_id in index.get(node_id, []):
                self._check_stored_messages({msg_id})
                msg = self.message_ins_store.get(msg_id)
                if msg is None:
                    continue
                alive.append(msg_id)
                if (
                    (not limit or len(found) < limit)
                    and msg.metadata.dst_node_id == node_id
                    and (run_id is None or msg.metadata.run_id == run_id)
                    and msg.metadata.delivered_at == ""
                ):
                    found.append(msg)
            index[node_id] = alive
        delivered_at = now().isoformat()
        for msg in found:
            msg.metadata.delivered_at = delivered_at
        return found

    InMemoryLinkState.store_message_ins = store_indexed  # type: ignore[method-assign]
    InMemoryLinkState.get_message_ins = get_indexed  # type: ignore[method-assign]


def process_pss(root: int) -> list[tuple[str, int]]:
    """``(name, PSS bytes)`` of every process under ``root``, largest first (name: the
    process's ``comm``, e.g. ``python``, ``raylet``, ``ray::ClientAppActor``)."""
    out = []
    for pid in descendants(root):
        try:
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/smaps_rollup") as f:
                pss = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("Pss:"))
        except (OSError, StopIteration):
            continue
        out.append((f"{name}[{pid}]" if pid != root else f"{name}[bench]", pss))
    return sorted(out, key=lambda item: -item[1])


class TimelineSampler(MemorySampler):
    """:class:`MemorySampler` that also keeps every ``(seconds since start, Σ PSS)`` sample."""

    def __init__(self, interval: float = 0.25) -> None:
        super().__init__(interval)
        self.samples: list[tuple[float, int]] = []
        self.t0 = time.monotonic()
        self.peak_breakdown: list[tuple[str, int]] = []

    def run(self) -> None:
        while not self._stop_event.is_set():
            rss, pss, n = tree_memory(os.getpid())
            if pss > self.peak_pss:
                self.peak_breakdown = process_pss(os.getpid())
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
            self.peak_procs = max(self.peak_procs, n)
            self.samples.append((time.monotonic() - self.t0, pss))
            self._stop_event.wait(self.interval)

    def peak_between(self, start: float, end: float) -> int:
        """The largest Σ PSS sampled from ``start`` to ``end`` s after the start (0 if none)."""
        return max((p for t, p in self.samples if start <= t <= end), default=0)


@contextlib.contextmanager
def note_releases(times: list[float], t0: float) -> Iterator[None]:
    """Append ``time.monotonic() - t0`` to ``times`` whenever the run records a round (this
    process's :meth:`fedpriv.run.job.ServerJob.round_released`, wrapped; what it does is
    unchanged)."""
    from fedpriv.run.job import ServerJob as Job

    original = Job.round_released

    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        times.append(time.monotonic() - t0)
        return out

    Job.round_released = wrapped  # type: ignore[method-assign]
    try:
        yield
    finally:
        Job.round_released = original  # type: ignore[method-assign]


def write_idx(path: Path, arr: Any) -> None:
    """One uint8 IDX file, gzip level 1 (``fedpriv.data.idx.read_idx`` reads it)."""
    import numpy as np

    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(struct.pack(">I", d) for d in arr.shape)
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(header + arr.tobytes())


def build_rows(rows: int, directory: Path) -> list[str]:
    """Hydra overrides for a training set of ``rows`` images (embedded data up to 6,000).

    Beyond 6,000: the 6,000 embedded training images followed by ``rows - 6000`` of them drawn
    with replacement (``default_rng(12345)``), with the 1,000 embedded test images, as the
    official Fashion-MNIST IDX files in ``directory``, read by ``dataset.name=fashion_mnist``.
    """
    if rows <= EMBEDDED_ROWS:
        return []
    import numpy as np

    from fedpriv.data.embedded import read_embedded_arrays

    raw = read_embedded_arrays()
    extra = np.random.default_rng(EXTRA_SEED).integers(0, EMBEDDED_ROWS, size=rows - EMBEDDED_ROWS)
    src = np.concatenate([np.arange(EMBEDDED_ROWS), extra]).astype(np.int64)
    directory.mkdir(parents=True, exist_ok=True)
    write_idx(directory / "train-images-idx3-ubyte.gz", raw["x_train"][src])
    write_idx(directory / "train-labels-idx1-ubyte.gz", raw["y_train"][src])
    write_idx(directory / "t10k-images-idx3-ubyte.gz", raw["x_test"])
    write_idx(directory / "t10k-labels-idx1-ubyte.gz", raw["y_test"])
    return ["dataset=fashion_mnist", f"dataset.data_dir={directory}"]


class Floor:
    """The round of a run in a plain torch loop (one thread), on the run's own data.

    ``cohort(r)`` gives round ``r``'s client ids; the global weights start from the run's
    initial model. A logistic model runs as ``nn.Linear`` on pre-flattened rows (as
    ``peer-pfl/floor_plain.py``); another model runs as it is built.
    """

    def __init__(self, plan: Any) -> None:
        import torch
        from torch import nn

        from fedpriv.run.setup import build_model_for, partitions, run_dataset

        self.ds, self.parts = run_dataset(plan), partitions(plan)
        self.sampler = plan.cohort
        self.lr = float(plan.client["lr"])
        self.server_lr = float(plan.strategy["server_lr"])
        model = build_model_for(plan)
        self.flat = plan.model.name == "logistic"
        if self.flat:
            linear = model.get_submodule("net.1")
            assert isinstance(linear, nn.Linear)
            plain = nn.Linear(linear.in_features, linear.out_features)
            plain.load_state_dict(linear.state_dict())
            self.model: nn.Module = nn.Sequential(plain)
        else:
            self.model = model
        self.glob0 = [p.detach().clone() for p in self.model.parameters()]
        self._torch = torch

    def users(self, server_round: int) -> list[tuple[Any, Any]]:
        """``(x, y)`` tensors of round ``server_round``'s cohort (built before any timing)."""
        torch = self._torch
        out = []
        for c in self.sampler.draw(server_round).tolist():
            idx = self.parts[c]
            x = self.ds.x_train[idx]
            x = x.reshape(len(x), -1) if self.flat else x
            out.append((torch.from_numpy(x), torch.from_numpy(self.ds.y_train[idx])))
        return out

    def one_round(self, glob: list[Any], users: list[tuple[Any, Any]]) -> list[Any]:
        """Every user's local step from ``glob``, summed; the server step; the new weights."""
        divisor = self.sampler.expected_size
        return plain_round(self.model, glob, users, self.lr, self.server_lr, divisor)

    def write_workload(self, folder: Path, rounds: int) -> bool:
        """Rounds 1..``rounds`` as the floor process's input (:mod:`floor_process`); ``False``
        (nothing written) for a model other than the logistic layer."""
        if not self.flat:
            return False
        cohorts = [
            [self.parts[c] for c in self.sampler.draw(r).tolist()] for r in range(1, 1 + rounds)
        ]
        steps = {
            "lr": self.lr,
            "server_lr": self.server_lr,
            "divisor": float(self.sampler.expected_size),
        }
        glob0 = [g.numpy() for g in self.glob0]
        write_workload(folder, self.ds.x_train, self.ds.y_train, cohorts, glob0, steps)
        return True

    def seconds(self, reps: int) -> list[float]:
        """Times of ``reps`` rounds (rounds 2..reps+1's cohorts) after a warm-up round, 1 thread."""
        torch = self._torch
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            glob = [g.clone() for g in self.glob0]
            times = []
            for r in range(1, reps + 2):
                users = self.users(r)
                t0 = time.perf_counter()
                glob = self.one_round(glob, users)
                times.append(time.perf_counter() - t0)
                del users
            return times[1:]
        finally:
            torch.set_num_threads(threads)

    def accuracies(self, rounds: int) -> list[float]:
        """Test accuracy after each of ``rounds`` plain rounds (cohorts of rounds 1..)."""
        from fedpriv.models.evaluate import evaluate

        torch = self._torch
        glob = [g.clone() for g in self.glob0]
        out = []
        for r in range(1, rounds + 1):
            glob = self.one_round(glob, self.users(r))
            with torch.no_grad():
                for p, g in zip(self.model.parameters(), glob, strict=True):
                    p.copy_(g)
            x = self.ds.x_test.reshape(len(self.ds.x_test), -1) if self.flat else self.ds.x_test
            out.append(evaluate(self.model, x, self.ds.y_test)[0])
        return out


def import_seconds() -> float:
    """Seconds a fresh interpreter takes to import what ``fedpriv`` runs (the bench itself
    has them loaded, so its in-process run starts without them)."""
    t0 = time.monotonic()
    subprocess.run(
        [sys.executable, "-c", "import fedpriv.cli.experiment, fedpriv.run.runner"],
        check=True,
        capture_output=True,
    )
    return time.monotonic() - t0


def run_workload(
    name: str,
    overrides: list[str],
    rounds: int,
    floor_reps: int,
) -> dict[str, Any]:
    """The fedpriv run of ``overrides`` between two floor measurements; its figures."""
    from fedpriv.run.prepare import prepare
    from fedpriv.run.runner import run_experiment

    cfg = compose(overrides)
    plan, _ = prepare(cfg)
    load0 = os.getloadavg()
    floor = Floor(plan)
    before = floor.seconds(floor_reps)
    floor_acc = floor.accuracies(rounds)
    rows = len(floor.ds.y_train)
    del floor
    gc.collect()
    sampler = TimelineSampler()
    released: list[float] = []  # when each round was recorded, on the sampler's clock
    sampler.start()
    t0 = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="fedpriv_bench_clients_") as out,
        note_releases(released, sampler.t0),
    ):
        summary = run_experiment(cfg, Path(out))
    wall = time.monotonic() - t0
    sampler.stop()
    ok = [r for r in summary["rounds"] if r.get("status") == "ok"]
    floor = Floor(plan)
    after = floor.seconds(floor_reps)
    imports = import_seconds()
    with tempfile.TemporaryDirectory(prefix="fedpriv_bench_floor_") as tmp:
        alone = run_floor_process(Path(tmp)) if floor.write_workload(Path(tmp), rounds) else None
    del floor
    times = [float(r["round_time_s"]) for r in ok]
    fed = statistics.median(times[1:]) if len(times) > 1 else float("nan")
    # the less disturbed of the two measurements (the slower one would flatter fedpriv)
    floor_s = min(statistics.median(before), statistics.median(after))
    acc = [float(r["accuracy"]) for r in ok]
    return {
        "workload": name,
        "num_clients": plan.num_clients,
        "cohort_size": [int(r["cohort_size"]) for r in ok],
        "client_sampling": plan.cohort.client_sampling.value,
        "rows": rows,
        "vmap_clients": plan.vmap_clients,
        "status": summary["status"],
        "round_time_s": times,
        "fedpriv_s_per_round": fed,
        "floor_s_before": before,
        "floor_s_after": after,
        "floor_s_per_round": floor_s,
        "ratio": fed / floor_s,
        "accuracy_fedpriv": acc,
        "accuracy_floor": floor_acc[: len(acc)],
        "startup_and_teardown_s": wall - sum(times),
        "wall_s": wall,
        "floor_process": alone,
        "import_s": imports,
        "startup_with_imports_s": imports + wall - sum(times),
        "wall_with_imports_s": imports + wall,
        "peak_pss_bytes": sampler.peak_pss,
        "steady_peak_pss_bytes": sampler.peak_between(released[0], released[-1])
        if len(released) > 1
        else 0,
        "peak_rss_bytes": sampler.peak_rss,
        "peak_processes": sampler.peak_procs,
        "peak_pss_by_process": sampler.peak_breakdown,
        "loadavg_before": load0,
        "loadavg_after": os.getloadavg(),
        "overrides": overrides,
    }


def print_figures(res: dict[str, Any], target_ratio: float = 1.5) -> None:
    sizes = sorted(set(res["cohort_size"]))
    cohort = (
        f"{res['num_clients']} clients, all training"
        if res["client_sampling"] == "all"
        else f"{res['num_clients']} registered, {res['client_sampling']} cohort of "
        + "/".join(map(str, sizes))
    )
    load = "/".join(f"{v:.1f}" for v in res["loadavg_before"])
    load_end = "/".join(f"{v:.1f}" for v in res["loadavg_after"])
    print(f"[{res['workload']}] {cohort}; {res['rows']} training rows; status={res['status']}")
    print(f"  vmap_clients={res['vmap_clients']}; load average (1/5/15 min) {load} -> {load_end}")
    rounds = ", ".join(f"{t:.2f}" for t in res["round_time_s"])
    print(
        f"  fedpriv: rounds {rounds} s -> {res['fedpriv_s_per_round']:.3f} s/round "
        "(median after the first)"
    )
    print(
        f"  floor (plain torch loop, 1 thread, same data and cohorts): "
        f"{res['floor_s_per_round']:.3f} s/round (the lower median: before "
        f"{statistics.median(res['floor_s_before']):.3f}, after "
        f"{statistics.median(res['floor_s_after']):.3f})"
    )
    verdict = "met" if res["ratio"] <= target_ratio else "NOT met"
    print(f"  ratio fedpriv / floor: {res['ratio']:.2f} (target <= {target_ratio}: {verdict})")
    diff = max(
        (abs(a - b) for a, b in zip(res["accuracy_fedpriv"], res["accuracy_floor"])), default=0.0
    )
    print(
        "  test accuracy per round: fedpriv "
        + " ".join(f"{a:.4f}" for a in res["accuracy_fedpriv"])
        + "; floor "
        + " ".join(f"{a:.4f}" for a in res["accuracy_floor"])
        + f" (max |diff| {diff:.4f})"
    )
    pss, steady = res["peak_pss_bytes"] / GIB, res["steady_peak_pss_bytes"] / GIB
    steady_s = f"{steady:.2f} GiB" if steady else "no sample (rounds under 0.25 s)"
    print(
        f"  peak memory, {res['peak_processes']} processes: Σ PSS {pss:.2f} GiB "
        f"(target <= 2 GiB: {'met' if pss <= 2 else 'NOT met'}), "
        f"Σ RSS {res['peak_rss_bytes'] / GIB:.2f} GiB; from round 1's end to the last round's: "
        f"Σ PSS {steady_s}; "
        f"start-up + shut-down {res['startup_and_teardown_s']:.1f} s, wall {res['wall_s']:.1f} s"
    )
    alone = res["floor_process"]
    if alone:
        startup, wall = res["startup_with_imports_s"], res["wall_with_imports_s"]
        mem = res["peak_pss_bytes"] / alone["peak_pss_bytes"]
        print(
            "  against the plain loop as a process (numpy + torch, 1 thread, same rounds; "
            f"fedpriv's include its imports in a fresh interpreter, {res['import_s']:.1f} s):"
            f" start-up + shut-down {startup:.1f} s vs {alone['startup_s']:.1f} s "
            f"({startup / alone['startup_s']:.1f}x), peak Σ PSS {pss:.2f} vs "
            f"{alone['peak_pss_bytes'] / GIB:.2f} GiB ({mem:.1f}x), whole run {wall:.1f} s vs "
            f"{alone['wall_s']:.1f} s ({wall / alone['wall_s']:.1f}x)"
        )
    top = res["peak_pss_by_process"][:4]
    print(
        "  at the peak: "
        + ", ".join(f"{name} {pss / GIB:.2f}" for name, pss in top)
        + f" GiB (largest {len(top)} of {len(res['peak_pss_by_process'])} processes)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--clients",
        type=int,
        nargs="*",
        default=[1000],
        help="peer workload: numbers of clients, all training (none: skip; default 1000)",
    )
    parser.add_argument(
        "--registered", type=int, default=100_000, help="cohort workload: registered clients"
    )
    parser.add_argument(
        "--sampled", type=int, default=1000, help="cohort workload: clients per round"
    )
    parser.add_argument("--no-cohort", action="store_true", help="skip the cohort workload")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of each fedpriv run")
    parser.add_argument(
        "--floor-reps", type=int, default=5, help="floor rounds before and after each run"
    )
    parser.add_argument("--cpus", type=int, default=2, help="ray_init_args.num_cpus")
    parser.add_argument("--client-cpus", type=float, default=1.0, help="client_resources.num_cpus")
    parser.add_argument(
        "--pull-interval",
        type=float,
        default=None,
        help="seconds between the server's reply polls (flwr InMemoryGrid.pull_interval)",
    )
    parser.add_argument(
        "--indexed-linkstate",
        action="store_true",
        help="EXPERIMENT: index flwr's in-memory message store by node",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be >= 2 (the median is taken after the first round)")
    logging.getLogger("absl").setLevel(logging.ERROR)  # dp-accounting's RDP order warnings
    if args.pull_interval is not None:
        set_pull_interval(args.pull_interval)
    if args.indexed_linkstate:
        index_linkstate_by_node()
    common = [
        *PEER_OVERRIDES,
        f"num_rounds={args.rounds}",
        f"ray_init_args.num_cpus={args.cpus}",
        f"client_resources.num_cpus={args.client_cpus}",
    ]
    plan = [(f"peer N={n}", n, [f"num_clients={n}"]) for n in args.clients]
    if not args.no_cohort:
        plan.append(
            (
                f"cohort {args.registered}/{args.sampled}",
                args.registered,
                [
                    f"num_clients={args.registered}",
                    "client_sampling=fixed_size",
                    f"num_sampled_clients={args.sampled}",
                ],
            )
        )
    results = []
    with tempfile.TemporaryDirectory(prefix="fedpriv_bench_data_") as tmp:
        for name, rows, own in plan:
            data = build_rows(rows, Path(tmp) / f"rows_{rows}")
            res = run_workload(
                name, [*common, *data, *own, *args.overrides], args.rounds, args.floor_reps
            )
            print_figures(res)
            sys.stdout.flush()
            results.append(res)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if all(r["status"] == "complete" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
