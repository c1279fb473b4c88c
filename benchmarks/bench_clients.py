"""Many virtual clients through Flower's simulation engine: per-round overhead and peak memory.

``python benchmarks/bench_clients.py --clients 1000`` runs the real fedpriv experiment
(``run_experiment``: Flower ``run_simulation`` on a local Ray instance) with every client
training each round: logistic regression on the embedded Fashion-MNIST (6000 samples, so 6 per
client at 1000 clients), ``client.steps`` local DP-SGD steps. It prints, per round, the wall
time and the overhead beyond compute, and the peak memory of the whole process tree (this
process, Ray's GCS/raylet and every worker/actor), sampled every 0.25 s.

Definitions
-----------
compute per round
    ``num_clients × c / actors``, with ``c`` the median time of one client's
    ``algorithm.train`` (model build and state load included) measured in this process on
    a sample of clients with one thread, and ``actors = cpus / client_resources.num_cpus``:
    the round time a perfect engine would need.
overhead per round
    the measured round time (``round_time_s`` of the run: send, client work, replies, sum)
    minus compute per round.
peak memory
    the largest sample of Σ RSS over the process tree (over-counts pages the processes
    share, such as torch's libraries) and of Σ PSS (each shared page split between its
    users; the truer figure).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PAGE = os.sysconf("SC_PAGE_SIZE")


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

    from fedpriv.config import conf_dir, register_schema

    register_schema()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides)


def client_compute_seconds(cfg: Any, sample: int) -> float:
    """Mean seconds of one client's training (model build, state load, ``algorithm.train``)."""
    import numpy as np
    import torch

    from fedpriv.algorithm import TrainContext
    from fedpriv.client_app import _client_data
    from fedpriv.noise import make_generator
    from fedpriv.runner import prepare
    from fedpriv.setup import build_model_for

    run_cfg, algorithm = prepare(cfg)
    torch.set_num_threads(1)
    state = build_model_for(run_cfg).state_dict()
    cfg_json = json.dumps(run_cfg, sort_keys=True)
    n = int(run_cfg["num_clients"])
    ids = np.linspace(0, n - 1, min(sample, n)).astype(int)
    times = []
    for pid in ids:
        data = _client_data(cfg_json, int(pid))
        t0 = time.perf_counter()
        model = build_model_for(run_cfg)
        model.load_state_dict(state)
        rng = np.random.default_rng([0, 1, int(pid)])
        ctx = TrainContext(
            server_round=1, rng=rng, generator=make_generator(int(pid)), device=torch.device("cpu")
        )
        algorithm.train(model, data, ctx)
        times.append(time.perf_counter() - t0)
    torch.set_num_threads(os.cpu_count() or 1)
    return statistics.median(times)  # robust to load spikes of a shared machine


def bench(
    num_clients: int,
    rounds: int,
    steps: int,
    cpus: int,
    client_cpus: float,
    sample_rate: float,
    extra: list[str],
) -> dict[str, Any]:
    """Run one experiment and return its figures (seconds, bytes)."""
    from fedpriv.runner import run_experiment

    overrides = [
        f"num_clients={num_clients}",
        f"num_rounds={rounds}",
        f"client.steps={steps}",
        "model=logistic",
        f"privacy.sample_rate={sample_rate}",
        "progress=false",
        "plot=false",
        "save_model=false",
        f"ray_init_args.num_cpus={cpus}",
        f"client_resources.num_cpus={client_cpus}",
        "round_timeout=3600",
        *extra,
    ]
    cfg = compose(overrides)
    per_client = client_compute_seconds(cfg, sample=50)
    actors = int(cpus / client_cpus)
    compute = num_clients * per_client / actors
    sampler = MemorySampler()
    sampler.start()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fedpriv_bench_clients_") as out:
        summary = run_experiment(cfg, Path(out))
    wall = time.monotonic() - t0
    sampler.stop()
    round_times = [float(r["round_time_s"]) for r in summary["rounds"] if r.get("status") == "ok"]
    return {
        "num_clients": num_clients,
        "rounds_ok": len(round_times),
        "status": summary["status"],
        "cpus": cpus,
        "actors": actors,
        "client_compute_s": per_client,
        "compute_per_round_s": compute,
        "round_time_s": round_times,
        "overhead_per_round_s": [t - compute for t in round_times],
        "startup_and_teardown_s": wall - sum(round_times),
        "wall_s": wall,
        "peak_rss_bytes": sampler.peak_rss,
        "peak_pss_bytes": sampler.peak_pss,
        "peak_processes": sampler.peak_procs,
        "overrides": overrides,
    }


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


def print_figures(res: dict[str, Any]) -> None:
    gib = 1024**3
    print(
        f"{res['num_clients']} clients, {res['actors']} actors on {res['cpus']} CPUs: "
        f"status={res['status']}, "
        f"{res['rounds_ok']} rounds"
    )
    print(
        f"  one client's compute {1e3 * res['client_compute_s']:.2f} ms -> compute per round "
        f"{res['compute_per_round_s']:.2f} s"
    )
    for i, (t, o) in enumerate(
        zip(res["round_time_s"], res["overhead_per_round_s"], strict=True), start=1
    ):
        print(f"  round {i}: {t:.2f} s, overhead beyond compute {o:.2f} s")
    if res["overhead_per_round_s"]:
        print(
            f"  overhead per round: median {statistics.median(res['overhead_per_round_s']):.2f} s "
            f"(target <= 5 s)"
        )
    print(
        f"  start-up + shut-down {res['startup_and_teardown_s']:.1f} s, wall {res['wall_s']:.1f} s"
    )
    print(
        f"  peak memory of the process tree ({res['peak_processes']} processes): "
        f"PSS {res['peak_pss_bytes'] / gib:.2f} GiB, "
        f"RSS {res['peak_rss_bytes'] / gib:.2f} GiB (target <= 2 GB)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--clients", type=int, nargs="+", default=[1000], help="numbers of virtual clients"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--steps", type=int, default=1, help="local DP-SGD steps per round (client.steps)"
    )
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray instance")
    parser.add_argument("--client-cpus", type=float, default=1.0, help="client_resources.num_cpus")
    parser.add_argument("--sample-rate", type=float, default=0.5, help="privacy.sample_rate")
    parser.add_argument(
        "--pull-interval",
        type=float,
        default=None,
        help=(
            "seconds between the server's reply polls "
            "(flwr InMemoryGrid.pull_interval, default 0.1)"
        ),
    )
    parser.add_argument(
        "--indexed-linkstate",
        action="store_true",
        help=(
            "EXPERIMENT: index flwr's in-memory message store by node (see index_linkstate_by_node)"
        ),
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="also write the figures to this JSON file"
    )
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    args = parser.parse_args(argv)
    logging.getLogger("absl").setLevel(logging.ERROR)  # dp-accounting's RDP order warnings
    if args.pull_interval is not None:
        set_pull_interval(args.pull_interval)
    if args.indexed_linkstate:
        index_linkstate_by_node()
    results = []
    for n in args.clients:
        res = bench(
            n,
            args.rounds,
            args.steps,
            args.cpus,
            args.client_cpus,
            args.sample_rate,
            args.overrides,
        )
        print_figures(res)
        results.append(res)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if all(r["status"] == "complete" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
