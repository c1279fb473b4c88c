"""pfl (pfl-research 0.6.0) with central Gaussian DP on fedpriv's client-level workload.

Run with the pfl venv (``$PFL_PY``), never the project's. Workload (issue 13 item 5/6): full
Fashion-MNIST 60k/10k standardized as fedpriv does (``(x/255 - 0.2860)/0.3530``, float32),
split over 6,000 clients of 10 images by fedpriv's own IID partitioner (``split_6000.npz``
from ``make_split.py``, checked by sha256), logistic regression 784 -> 10 from fedpriv's
seed-0 weights (checked equal). Each round: a cohort of 120 users (pfl's ``train_cohort_size``;
user sampler ``random`` by default, see below), each user 1 local epoch of plain SGD with
batch size 10 (one step), lr 0.1, mean cross-entropy; pfl's ``CentrallyAppliedPrivacyMechanism(
GaussianMechanism)`` clips every user's model delta to L2 norm C = 1 (one norm over all
parameters), adds N(0, (σC)²) with σ = 1 to the cohort sum, the sum is divided by the cohort's
weight (120 users of weight 1), central optimizer SGD lr 1.0.

pfl's user samplers (pfl/data/sampling.py, ``get_user_sampler``): ``random`` draws each of the
cohort's 120 slots independently and uniformly from the 6,000 ids (``np.random.randint``), i.e.
a fixed-size cohort drawn WITH replacement (a user can fill two slots); ``minimize_reuse``
cycles through the id list in order (deterministic: no sampling randomness at all). pfl has no
without-replacement or Poisson user sampler; its accountants (``PLDPrivacyAccountant``,
``RDPPrivacyAccountant``) take a ``sampling_probability`` and analyse Poisson sampling,
add/remove neighbours. The ε printed here is what pfl reports for q = 120/6000 = 0.02.

Usage: run_pfl_client_level.py SPLIT_DIR OUT_JSON [ROUNDS=500] [--sampler=random|minimize_reuse]
       [--eval-every=10] [--threads=K] [--seed=0]

``--seed`` seeds numpy and torch (cohorts, noise); the initial weights are fedpriv's either way.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

MEAN, STD = 0.2860, 0.3530  # fedpriv/data/images.py FASHION_MNIST_MEAN / _STD
NUM_CLIENTS, COHORT, SIGMA, CLIP, DELTA = 6000, 120, 1.0, 1.0, 1e-5
LOCAL_LR, SERVER_LR, LOCAL_BATCH, LOCAL_EPOCHS = 0.1, 1.0, 10, 1


def read_idx(path: Path) -> np.ndarray:
    """An IDX ``.gz`` file of unsigned bytes as an array of its stated shape."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def standardize(images: np.ndarray) -> np.ndarray:
    """fedpriv's ``standardize_images``, flattened: ``(x/255 - mean)/std``, float32 (N, 784)."""
    x = images.astype(np.float32) / np.float32(255.0)
    x = (x - np.float32(MEAN)) / np.float32(STD)
    return x.reshape(len(x), -1).astype(np.float32, copy=False)


def sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


class LogReg(nn.Module):
    """fedpriv's ``logistic`` model: Flatten + Linear(784, 10) (same state_dict keys)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))

    def forward(self, x):
        return self.net(x)

    def loss(self, x, y, eval=False):
        self.eval() if eval else self.train()
        return nn.functional.cross_entropy(self(x), y)  # mean over the user's batch

    @torch.no_grad()
    def metrics(self, x, y, eval=False):
        from pfl.metrics import Weighted

        self.eval()
        out = self(x)
        return {
            "loss": Weighted(float(nn.functional.cross_entropy(out, y, reduction="sum")), len(y)),
            "accuracy": Weighted(float((out.argmax(1) == y).sum()), len(y)),
        }


def load_workload(
    split_dir: Path,
) -> tuple[dict[int, list[torch.Tensor]], torch.Tensor, torch.Tensor]:
    """fedpriv's 6,000 users of full Fashion-MNIST (``split_6000.npz``, checked by sha256
    against fedpriv's split) and the test split ``(users, x_test, y_test)``."""
    checks = json.loads((split_dir / "checks.json").read_text())
    data_dir = Path(checks["data_dir"])
    x_all = standardize(read_idx(data_dir / "train-images-idx3-ubyte.gz"))
    y_all = read_idx(data_dir / "train-labels-idx1-ubyte.gz").astype(np.int64)
    x_test = standardize(read_idx(data_dir / "t10k-images-idx3-ubyte.gz"))
    y_test = read_idx(data_dir / "t10k-labels-idx1-ubyte.gz").astype(np.int64)
    split = np.load(split_dir / "split_6000.npz")
    idx, offsets = split["idx"], split["offsets"]
    assert len(offsets) == NUM_CLIENTS + 1
    assert sha(x_all[idx]) == checks["sha256_x_users"], "client rows differ from fedpriv's"
    assert sha(y_all[idx]) == checks["sha256_y_users"], "client labels differ from fedpriv's"
    assert sha(x_test) == checks["sha256_x_test"], "test images differ from fedpriv's"
    users = {
        u: [
            torch.from_numpy(x_all[idx[offsets[u] : offsets[u + 1]]]),
            torch.from_numpy(y_all[idx[offsets[u] : offsets[u + 1]]]),
        ]
        for u in range(NUM_CLIENTS)
    }
    xt, yt = torch.from_numpy(x_test), torch.from_numpy(y_test)
    return users, xt, yt


def initial_model(split_dir: Path) -> LogReg:
    """The logistic model with fedpriv's seed-0 weights (``init_state.npz``, checked equal)."""
    net = LogReg()
    init = np.load(split_dir / "init_state.npz")
    state = net.state_dict()
    assert sorted(state) == sorted(init.files), (sorted(state), init.files)
    net.load_state_dict({k: torch.from_numpy(init[k]) for k in init.files})
    return net


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--"))
    split_dir, out = Path(args[0]), Path(args[1])
    rounds = int(args[2]) if len(args) > 2 else 500
    sampler_name = opts.get("sampler", "random")
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
        GaussianMechanism,
        PLDPrivacyAccountant,
        RDPPrivacyAccountant,
    )

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

    q = COHORT / NUM_CLIENTS
    common = dict(
        num_compositions=rounds, sampling_probability=q, mechanism="gaussian",
        noise_parameter=SIGMA, delta=DELTA,
    )  # fmt: skip
    pld = PLDPrivacyAccountant(**common)
    rdp = RDPPrivacyAccountant(**common)
    mechanism = GaussianMechanism.from_privacy_accountant(pld, clipping_bound=CLIP)
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
    import pfl

    cohorts = [drawn[i : i + COHORT] for i in range(0, COHORT * rounds, COHORT)]
    assert len(drawn) == COHORT * rounds, (len(drawn), COHORT * rounds)
    rounds_per_user = np.bincount(np.array(drawn), minlength=NUM_CLIENTS)

    res = {
        "framework": "pfl",
        "pfl_version": getattr(pfl, "__version__", "0.6.0"),
        "user_sampler": sampler_name,
        "seed": seed,
        "num_clients": NUM_CLIENTS,
        "cohort_size": COHORT,
        "rounds": rounds,
        "noise_multiplier": SIGMA,
        "clipping_norm": CLIP,
        "delta": DELTA,
        "local": {"lr": LOCAL_LR, "batch_size": LOCAL_BATCH, "epochs": LOCAL_EPOCHS},
        "server_lr": SERVER_LR,
        "accuracy": {str(k): v for k, v in sorted(accuracy.items())},
        "cohorts_with_a_repeated_user": sum(len(set(c)) < len(c) for c in cohorts),
        "max_slots_of_one_user_in_a_cohort": int(max(np.bincount(c).max() for c in cohorts)),
        "slots_per_user": {"min": int(rounds_per_user.min()), "max": int(rounds_per_user.max())},
        "epsilon_pfl_pld": float(pld.epsilon),
        "epsilon_pfl_rdp": float(rdp.epsilon),
        "pfl_sampling_probability": q,
        "noise_stddev_on_sum": float(mechanism.relative_noise_stddev) * CLIP,
        "seconds_total": t_end - t_start,
        "seconds_training": t_end - t_train,
        "seconds_per_round": (marks[-1] - t_train) / max(1, len(marks)) if marks else None,
        "torch_threads": torch.get_num_threads(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(json.dumps({k: v for k, v in res.items() if k != "accuracy"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
