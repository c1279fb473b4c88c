"""pfl 0.6.0 banded matrix factorization (DP-FTRL) on fedpriv's client-level workload.

Run with the pfl venv (``$PFL_PY``), never the project's. Same workload as
``../peer_client_level/run_pfl_client_level.py`` (full Fashion-MNIST 60k/10k standardized as
fedpriv does, fedpriv's IID split into 6,000 clients of 10 images checked by sha256, logistic
784 -> 10 from fedpriv's seed-0 weights, cohorts of 120, one local SGD step lr 0.1, every
user's delta clipped to C = 1, server SGD lr 1, 500 rounds), except the privacy mechanism:
``CentrallyAppliedPrivacyMechanism(BandedMatrixFactorizationMechanism(clipping_bound=1,
num_iterations=500, min_separation=50, make_privacy_accountant))`` (pfl/privacy/ftrl_mechanism.py):
round i adds row i of ``C^{-1} Z`` to the cohort sum, ``C = np.linalg.cholesky(X)`` of the banded
Gram matrix pfl optimises. Users come from pfl's ``minimize_reuse`` sampler (a fixed cycle
through the 6,000 ids: every user in exactly the rounds r, r+50, ..., r+450, i.e. min
separation b = 50, k = 10 participations; checked from the recorded cohorts).

The noise multiplier is pfl's own calibration: ``make_privacy_accountant(k)`` returns
``PLDPrivacyAccountant(k, sampling_probability=Q, mechanism='gaussian', epsilon=3, delta=1e-5)``
with ``Q = 1`` by default (no amplification: the cycle is deterministic); ``--q=0.02`` uses the
convention of pfl-research's benchmarks (``max_cohort_size / population``). pfl writes
``./banded_mf_dp_ftrl/query_matrix.npy``: the script runs inside a scratch directory and copies
that matrix next to OUT_JSON.

Usage: run_pfl_bandmf.py SPLIT_DIR OUT_JSON [ROUNDS=500] [--min-sep=50] [--q=1.0]
       [--eval-every=10] [--threads=K] [--seed=0]
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peer_client_level"))
from run_pfl_client_level import (  # noqa: E402  (the same workload, data and model)
    CLIP,
    COHORT,
    DELTA,
    LOCAL_BATCH,
    LOCAL_EPOCHS,
    LOCAL_LR,
    NUM_CLIENTS,
    SERVER_LR,
    initial_model,
    load_workload,
)

EPSILON = 3.0


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--"))
    split_dir, out = Path(args[0]), Path(args[1])
    rounds = int(args[2]) if len(args) > 2 else 500
    sampler_name = "minimize_reuse"
    min_sep = int(opts.get("min-sep", 50))
    q_acc = float(opts.get("q", 1.0))
    eval_every = int(opts.get("eval-every", 10))
    if "threads" in opts:
        torch.set_num_threads(int(opts["threads"]))
    seed = int(opts.get("seed", 0))
    np.random.seed(seed)
    torch.manual_seed(seed)
    t_start = time.perf_counter()

    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNTrainHyperParams
    from pfl.metrics import Metrics
    from pfl.model.pytorch import PyTorchModel
    from pfl.privacy import (
        CentrallyAppliedPrivacyMechanism,
        PLDPrivacyAccountant,
    )
    from pfl.privacy.ftrl_mechanism import BandedMatrixFactorizationMechanism

    users, xt, yt = load_workload(split_dir)
    pfl_sampler = get_user_sampler(sampler_name, list(range(NUM_CLIENTS)))
    drawn: list[int] = []  # every user id pfl's sampler returns, in order (120 per round)

    def recording_sampler() -> int:
        user = pfl_sampler()
        drawn.append(int(user))
        return user

    train_data = FederatedDataset.from_slices(users, recording_sampler)
    val_data = FederatedDataset.from_slices({0: [xt, yt]}, get_user_sampler("minimize_reuse", [0]))

    net = initial_model(split_dir)
    model = PyTorchModel(
        model=net,
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD(net.parameters(), lr=SERVER_LR),
    )

    accountants: list = []

    def make_privacy_accountant(num_compositions: int) -> PLDPrivacyAccountant:
        acc = PLDPrivacyAccountant(
            num_compositions, sampling_probability=q_acc, mechanism="gaussian",
            epsilon=EPSILON, delta=DELTA,
        )  # fmt: skip
        accountants.append(acc)
        return acc

    out = out.resolve()
    cwd, scratch = os.getcwd(), tempfile.mkdtemp(prefix="pfl_bandmf_")
    os.chdir(scratch)  # pfl saves ./banded_mf_dp_ftrl/query_matrix.npy
    t_mf = time.perf_counter()
    mechanism = BandedMatrixFactorizationMechanism(
        clipping_bound=CLIP, num_iterations=rounds, min_separation=min_sep,
        make_privacy_accountant=make_privacy_accountant,
    )  # fmt: skip
    seconds_factorization = time.perf_counter() - t_mf
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(
        Path(scratch) / "banded_mf_dp_ftrl" / "query_matrix.npy",
        out.with_name(out.stem + "_query_matrix.npy"),
    )
    print(
        f"factorization {seconds_factorization:.1f}s sigma {mechanism.relative_noise_stddev}",
        flush=True,
    )
    backend = SimulatedBackend(
        training_data=train_data,
        val_data=val_data,
        postprocessors=[CentrallyAppliedPrivacyMechanism(mechanism)],
    )

    accuracy: dict[int, float] = {}
    marks: list[float] = []

    class Eval(TrainingProcessCallback):
        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            r = central_iteration + 1
            marks.append(time.perf_counter())
            if r % eval_every == 0 or r == rounds:
                with torch.no_grad():
                    net.eval()
                    accuracy[r] = float((net(xt).argmax(1) == yt).float().mean())
                print(f"round {r} accuracy {accuracy[r]:.4f}", flush=True)
            return False, Metrics()

    params = NNAlgorithmParams(
        central_num_iterations=rounds,
        evaluation_frequency=10**9,
        train_cohort_size=COHORT,
        val_cohort_size=0,
    )
    train_params = NNTrainHyperParams(
        local_num_epochs=LOCAL_EPOCHS, local_learning_rate=LOCAL_LR, local_batch_size=LOCAL_BATCH
    )
    t_train = time.perf_counter()
    FederatedAveraging().run(
        algorithm_params=params,
        backend=backend,
        model=model,
        model_train_params=train_params,
        callbacks=[Eval()],
    )
    t_end = time.perf_counter()
    os.chdir(cwd)
    shutil.rmtree(scratch, ignore_errors=True)
    import pfl

    cohorts = [drawn[i : i + COHORT] for i in range(0, COHORT * rounds, COHORT)]
    assert len(drawn) == COHORT * rounds, (len(drawn), COHORT * rounds)
    rounds_per_user = np.bincount(np.array(drawn), minlength=NUM_CLIENTS)
    last: dict[int, int] = {}
    min_gap = rounds
    for r, c in enumerate(cohorts):
        for u in c:
            if u in last:
                min_gap = min(min_gap, r - last[u])
            last[u] = r

    res = {
        "framework": "pfl",
        "pfl_version": getattr(pfl, "__version__", "0.6.0"),
        "user_sampler": sampler_name,
        "seed": seed,
        "num_clients": NUM_CLIENTS,
        "cohort_size": COHORT,
        "rounds": rounds,
        "mechanism": "BandedMatrixFactorizationMechanism",
        "min_separation": min_sep,
        "pfl_max_participation_k": accountants[0].num_compositions,
        "pfl_accountant_sampling_probability": q_acc,
        "target_epsilon": EPSILON,
        "noise_multiplier": float(mechanism.relative_noise_stddev),
        "clipping_norm": CLIP,
        "delta": DELTA,
        "local": {"lr": LOCAL_LR, "batch_size": LOCAL_BATCH, "epochs": LOCAL_EPOCHS},
        "server_lr": SERVER_LR,
        "accuracy": {str(k): v for k, v in sorted(accuracy.items())},
        "cohorts_with_a_repeated_user": sum(len(set(c)) < len(c) for c in cohorts),
        "slots_per_user": {"min": int(rounds_per_user.min()), "max": int(rounds_per_user.max())},
        "min_gap_between_a_users_rounds": min_gap,
        "epsilon_pfl_pld": float(accountants[0].epsilon),
        "seconds_factorization": seconds_factorization,
        "seconds_total": t_end - t_start,
        "seconds_training": t_end - t_train,
        "seconds_per_round": (marks[-1] - t_train) / max(1, len(marks)) if marks else None,
        "torch_threads": torch.get_num_threads(),
    }
    out.write_text(json.dumps(res, indent=2))
    print(json.dumps({k: v for k, v in res.items() if k != "accuracy"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
