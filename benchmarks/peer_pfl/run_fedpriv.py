"""One fedpriv run of the benchmark workload (run with fedpriv's venv).

fedpriv's own runner (fedpriv.run.runner.run_experiment: Flower 1.42 run_simulation on a local
Ray instance with 2 CPUs, 2 actors), N clients, every client trains every round, 1 local
step over its whole local data with noise and clipping switched off:

    model=logistic num_clients=N client.steps=1 client.lr=0.1 strategy.server_lr=1.0
    privacy.noise_multiplier=0 privacy.max_grad_norm=1e6 privacy.sample_rate=1.0

(sample_rate=1 -> the Poisson batch is the whole local data set and the step divides the
sum of per-sample gradients by q*n = n, i.e. the mean gradient; max_grad_norm=1e6 -> no
per-sample gradient is clipped, checked below; noise 0 -> plain SGD.)

Peak memory: bench_clients.py's sampler (Σ PSS and Σ RSS over this process and every
descendant: Ray's GCS, raylet, workers, actors), every 0.25 s; progress (peaks so far,
rounds finished) is written to ``<out>/progress.json`` every 2 s so that a run killed by
the timeout still leaves its figures; per-round times are in ``<out>/metrics.csv``.

Usage: run_fedpriv.py N ROUNDS OUT_DIR [extra Hydra overrides]
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# fedpriv's adapted copy (benchmarks/peer_pfl/): the peer benchmark's own modules (paths.py)
# stay in ../shared/bench/peer-pfl, or where PEER_PFL_DIR points.
PEER = Path(os.environ.get("PEER_PFL_DIR", HERE.parents[2] / "shared" / "bench" / "peer-pfl"))
sys.path.insert(0, str(PEER))
from paths import RAY_TMP, REPO, WORK  # noqa: E402

sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import numpy as np  # noqa: E402
from bench_clients import MemorySampler, compose  # noqa: E402


class ProgressSampler(MemorySampler):
    def __init__(self, path: Path, interval: float = 0.25) -> None:
        super().__init__(interval)
        self.path = path
        self.t0 = time.monotonic()

    def run(self) -> None:  # same sampling as MemorySampler, plus a progress file
        from bench_clients import tree_memory

        last = 0.0
        while not self._stop_event.is_set():
            rss, pss, n = tree_memory(os.getpid())
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
            self.peak_procs = max(self.peak_procs, n)
            now = time.monotonic()
            if now - last >= 2.0:
                self.dump()
                last = now
            self._stop_event.wait(self.interval)

    def dump(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "elapsed_s": time.monotonic() - self.t0,
                    "peak_pss_bytes": self.peak_pss,
                    "peak_rss_bytes": self.peak_rss,
                    "peak_processes": self.peak_procs,
                    "loadavg": os.getloadavg(),
                }
            )
        )
        tmp.replace(self.path)


def main() -> int:
    n, rounds, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    extra = sys.argv[4:]
    out.mkdir(parents=True, exist_ok=True)
    overrides = [
        f"num_clients={n}",
        f"num_rounds={rounds}",
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
        "ray_init_args.num_cpus=2",
        "client_resources.num_cpus=1",
        "round_timeout=3600",
        f"+ray_init_args._temp_dir={RAY_TMP}",
    ]
    if n > 6000:
        overrides += [
            "dataset.name=fashion_mnist",
            f"dataset.data_dir={WORK / 'data' / 'fmnist_10k'}",
        ]
    overrides += extra
    cfg = compose(overrides)

    # the split fedpriv will use must be the exported one that pfl uses
    from fedpriv.data.embedded import read_embedded_arrays
    from fedpriv.run.prepare import prepare
    from fedpriv.run.setup import partitions, run_dataset

    plan, _ = prepare(cfg)
    ds, parts = run_dataset(plan), partitions(plan)
    split = np.load(WORK / "data" / f"split_{n}.npz")
    raw = read_embedded_arrays()
    for u in (0, n // 2, n - 1):
        want = split["idx"][split["offsets"][u] : split["offsets"][u + 1]]
        assert np.array_equal(ds.y_train[parts[u]], raw["y_train"][want].astype(np.int64)), u
    assert len(parts) == n

    sampler = ProgressSampler(out / "progress.json")
    sampler.start()
    from fedpriv.run.runner import run_experiment

    load0 = os.getloadavg()
    t0 = time.monotonic()
    summary = run_experiment(cfg, out)
    wall = time.monotonic() - t0
    sampler.stop()
    sampler.dump()
    rows = [r for r in summary["rounds"] if r.get("status") == "ok"]
    res = {
        "framework": "fedpriv",
        "num_clients": n,
        "rounds": rounds,
        "status": summary["status"],
        "round_time_s": [float(r["round_time_s"]) for r in rows],
        "accuracy": [float(r["accuracy"]) for r in rows],
        "max_client_examples": [r.get("client_metrics", {}) for r in rows][-1:],
        "wall_s": wall,
        "startup_and_teardown_s": wall - sum(float(r["round_time_s"]) for r in rows),
        "peak_pss_bytes": sampler.peak_pss,
        "peak_rss_bytes": sampler.peak_rss,
        "peak_processes": sampler.peak_procs,
        "loadavg_start": load0,
        "loadavg_end": os.getloadavg(),
        "overrides": overrides,
    }
    (out / "result.json").write_text(json.dumps(res, indent=2, default=str))
    print(json.dumps({k: v for k, v in res.items() if k != "overrides"}, default=str))
    return 0 if summary["status"] == "complete" else 1


if __name__ == "__main__":
    sys.exit(main())
