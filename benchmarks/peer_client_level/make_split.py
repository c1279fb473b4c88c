"""Export fedpriv's exact client-level workload for pfl (run with fedpriv's venv).

Writes to OUT_DIR:

* ``split_6000.npz``: every client's training rows as indices into the 60,000 official
  Fashion-MNIST training images (``idx`` concatenated over clients, ``offsets`` of length
  6001), taken from fedpriv's own partitioner (:func:`fedpriv.run.setup.partitions`,
  ``partition=iid``, ``seed=0``), so pfl trains on exactly fedpriv's split.
* ``init_state.npz``: fedpriv's seed-0 initial ``logistic`` weights (784 -> 10), which pfl's
  model must equal before training.
* ``checks.json``: sha256 of fedpriv's standardized float32 arrays (client rows in split order,
  and the 10,000 test images), which the pfl script recomputes from the IDX files.

Usage: make_split.py OUT_DIR [DATA_DIR]   (DATA_DIR default /work/shared/data/fashion-mnist)
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from fedpriv.run.config import compose_config
from fedpriv.run.plan import RunPlan
from fedpriv.run.prepare import prepare
from fedpriv.run.setup import build_model_for, partitions, run_dataset

NUM_CLIENTS = 6000
DEFAULT_DATA_DIR = "/work/shared/data/fashion-mnist"


def workload_plan(data_dir: str) -> RunPlan:
    """The run plan of ``+experiment=client_level_fmnist`` (full Fashion-MNIST in
    ``data_dir``, IID over 6,000 clients, ``seed=0``, logistic): what fixes the dataset, the
    split and the initial model."""
    cfg = compose_config(
        ["+experiment=client_level_fmnist", f"dataset.data_dir={data_dir}", "seed=0"]
    )
    plan, _ = prepare(cfg)
    assert plan.num_clients == NUM_CLIENTS and plan.model.name == "logistic"
    return plan


def sha256(a: np.ndarray) -> str:
    """sha256 of the array's float32 bytes, flattened to (rows, features)."""
    flat = np.ascontiguousarray(a.reshape(len(a), -1), dtype=np.float32)
    return hashlib.sha256(flat.tobytes()).hexdigest()


def main() -> int:
    out = Path(sys.argv[1])
    data_dir = sys.argv[2] if len(sys.argv) > 2 else DEFAULT_DATA_DIR
    out.mkdir(parents=True, exist_ok=True)
    cfg = workload_plan(str(Path(data_dir).resolve()))
    ds = run_dataset(cfg)
    assert len(ds.y_train) == 60000 and len(ds.y_test) == 10000, "not the full Fashion-MNIST"
    parts = [np.asarray(p, dtype=np.int64) for p in partitions(cfg)]
    sizes = np.array([len(p) for p in parts])
    assert len(parts) == NUM_CLIENTS and sizes.min() == sizes.max() == 10, sizes
    idx = np.concatenate(parts)
    assert len(np.unique(idx)) == 60000, "the IID split must use every image once"
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    np.savez(out / "split_6000.npz", idx=idx, offsets=offsets)
    model = build_model_for(cfg)
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    np.savez(out / "init_state.npz", **state)
    checks = {
        "data_dir": cfg.dataset.data_dir,
        "num_clients": NUM_CLIENTS,
        "client_size": 10,
        "init_keys": sorted(state),
        "sha256_x_users": sha256(ds.x_train[idx]),
        "sha256_y_users": hashlib.sha256(ds.y_train[idx].astype(np.int64).tobytes()).hexdigest(),
        "sha256_x_test": sha256(ds.x_test),
    }
    (out / "checks.json").write_text(json.dumps(checks, indent=2))
    print(json.dumps(checks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
