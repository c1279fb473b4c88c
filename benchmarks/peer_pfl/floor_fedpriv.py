"""fedpriv's own per-client work, N clients in a plain loop in one process (fedpriv's venv).

For each client, what clients/app.py train_handler does around the Flower message: build the
model (build_model_for), load the global state, make the client's rng / torch generator,
algorithm.train (LocalDPSGD, 1 step, sample_rate 1, noise 0, max_grad_norm 1e6: per-sample
gradients by fedpriv's ghost/book-keeping path, none clipped), then the server's sum of the
updates. One thread (as each fedpriv actor: torch.set_num_threads(1)). Median of REPS rounds
after a warm-up round; also the same loop with the model built once (algorithm.train only).
Also checks that no per-sample gradient norm reaches max_grad_norm.

Usage: floor_fedpriv.py OUT_JSON [N ...]
"""

# ruff: noqa: B023  (the round closures are defined and called within one loop iteration)
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# fedpriv's adapted copy (benchmarks/peer_pfl/): the peer benchmark's own modules (paths.py)
# stay in ../shared/bench/peer-pfl, or where PEER_PFL_DIR points.
PEER = Path(os.environ.get("PEER_PFL_DIR", HERE.parents[2] / "shared" / "bench" / "peer-pfl"))
sys.path.insert(0, str(PEER))
from paths import REPO, WORK  # noqa: E402

sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

REPS = 3


def main() -> None:
    from bench_clients import compose

    from clients.local_dpsgd import summed_cross_entropy
    from fedpriv.mechanisms.noise import make_generator
    from fedpriv.mechanisms.persample import clipped_grad_sum
    from fedpriv.run.algorithm import TrainContext
    from fedpriv.run.client_app import client_data
    from fedpriv.run.prepare import prepare
    from fedpriv.run.setup import build_model_for

    out = Path(sys.argv[1])
    ns = [int(a) for a in sys.argv[2:]] or [100, 1000, 10000]
    torch.set_num_threads(1)
    res = {"loadavg_start": os.getloadavg(), "threads": 1, "by_n": {}}
    for n in ns:
        overrides = [
            f"num_clients={n}",
            "num_rounds=5",
            "model=logistic",
            "client.steps=1",
            "client.lr=0.1",
            "privacy.noise_multiplier=0",
            "privacy.max_grad_norm=1e6",
            "privacy.sample_rate=1.0",
            "seed=0",
        ]
        if n > 6000:
            overrides += [
                "dataset.name=fashion_mnist",
                f"dataset.data_dir={WORK / 'data' / 'fmnist_10k'}",
            ]
        cfg = compose(overrides)
        run_cfg, algorithm = prepare(cfg)
        plan_json = run_cfg.to_payload()
        datas = [client_data(plan_json, pid) for pid in range(n)]
        state = build_model_for(run_cfg).state_dict()
        max_norm = 0.0
        for data in datas[:: max(1, n // 200)]:
            m = build_model_for(run_cfg)
            m.load_state_dict(state)
            _, norms = clipped_grad_sum(
                m, summed_cross_entropy, data.x, data.y, algorithm.privacy.max_grad_norm
            )
            max_norm = max(max_norm, float(norms.max()))

        def round_full(state, server_round):
            total = None
            for pid, data in enumerate(datas):
                model = build_model_for(run_cfg)
                model.load_state_dict(state)
                rng = np.random.default_rng([0, server_round, pid])
                gen = make_generator(
                    int(rng.integers(2**62)), device=torch.device("cpu"), secure_mode=False
                )
                ctx = TrainContext(
                    server_round=server_round, rng=rng, generator=gen, device=torch.device("cpu")
                )
                update, _ = algorithm.train(model, data, ctx)
                total = (
                    {k: v.clone() for k, v in update.items()}
                    if total is None
                    else {k: total[k] + v for k, v in update.items()}
                )
            return {k: state[k] + total[k] / n for k in state}

        def round_train_only(model, state, server_round):
            total = None
            for pid, data in enumerate(datas):
                model.load_state_dict(state)
                rng = np.random.default_rng([0, server_round, pid])
                gen = make_generator(
                    int(rng.integers(2**62)), device=torch.device("cpu"), secure_mode=False
                )
                ctx = TrainContext(
                    server_round=server_round, rng=rng, generator=gen, device=torch.device("cpu")
                )
                update, _ = algorithm.train(model, data, ctx)
                total = (
                    {k: v.clone() for k, v in update.items()}
                    if total is None
                    else {k: total[k] + v for k, v in update.items()}
                )
            return {k: state[k] + total[k] / n for k in state}

        entry = {
            "max_per_sample_grad_norm": max_norm,
            "max_grad_norm": algorithm.privacy.max_grad_norm,
        }
        s, times = dict(state), []
        for r in range(REPS + 1):
            t0 = time.perf_counter()
            s = round_full(s, r + 1)
            times.append(time.perf_counter() - t0)
        entry["with_model_build"] = {
            "round_s_median": statistics.median(times[1:]),
            "round_s": times,
            "per_client_ms": 1e3 * statistics.median(times[1:]) / n,
        }
        model = build_model_for(run_cfg)
        s, times = dict(state), []
        for r in range(REPS + 1):
            t0 = time.perf_counter()
            s = round_train_only(model, s, r + 1)
            times.append(time.perf_counter() - t0)
        entry["train_only"] = {
            "round_s_median": statistics.median(times[1:]),
            "round_s": times,
            "per_client_ms": 1e3 * statistics.median(times[1:]) / n,
        }
        res["by_n"][str(n)] = entry
        print(n, json.dumps(entry), flush=True)
    res["loadavg_end"] = os.getloadavg()
    out.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
