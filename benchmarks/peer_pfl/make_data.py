"""Build the shared inputs of the benchmark (run with fedpriv's venv).

* data/fmnist_10k/: IDX .gz files for fedpriv's ``dataset.name=fashion_mnist`` loader:
  train = the 6000 embedded training images followed by 4000 more drawn with replacement
  (numpy default_rng(12345)) from the same 6000; test = the 1000 embedded test images.
  Used only for N=10000 (fedpriv refuses more clients than training rows).
* data/split_{N}.npz: each user's training rows, expressed as indices into the 6000
  embedded training images (``idx`` concatenated, ``offsets`` of length N+1), taken from
  fedpriv's own partitioner (fedpriv.setup.partitions, partition=iid, seed=0), so pfl gets
  exactly the split fedpriv uses.
* data/init_state.npz: fedpriv's initial logistic-regression weights (seed 0), to check
  that pfl starts from the same weights.
* data/checks.json: sha256 of fedpriv's standardized training arrays per N.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import struct
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
# fedpriv's adapted copy (benchmarks/peer_pfl/): the peer benchmark's own modules (paths.py)
# stay in ../shared/bench/peer-pfl, or where PEER_PFL_DIR points.
PEER = Path(os.environ.get("PEER_PFL_DIR", HERE.parents[2] / "shared" / "bench" / "peer-pfl"))
sys.path.insert(0, str(PEER))
from paths import REPO, WORK  # noqa: E402

sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_clients import compose  # noqa: E402

from fedpriv.data.embedded import read_embedded_arrays  # noqa: E402
from fedpriv.run.prepare import prepare  # noqa: E402
from fedpriv.run.setup import build_model_for, partitions, run_dataset  # noqa: E402

DATA = WORK / "data"
DIR_10K = DATA / "fmnist_10k"
EXTRA_SEED = 12345


def write_idx(path: Path, arr: np.ndarray) -> None:
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(struct.pack(">I", d) for d in arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.tobytes())


def dataset_cfg(n: int):
    """The run plan of N clients (embedded data up to 6000, the 10k IDX files beyond)."""
    overrides = [f"num_clients={n}", "partition=iid", "seed=0", "model=logistic"]
    if n > 6000:
        overrides += ["dataset.name=fashion_mnist", f"dataset.data_dir={DIR_10K}"]
    plan, _ = prepare(compose(overrides))
    return plan


def main() -> None:
    DATA.mkdir(exist_ok=True)
    DIR_10K.mkdir(exist_ok=True)
    raw = read_embedded_arrays()
    extra = np.random.default_rng(EXTRA_SEED).integers(0, 6000, size=4000)
    src_10k = np.concatenate([np.arange(6000), extra]).astype(
        np.int64
    )  # row r of the 10k set = embedded image src_10k[r]
    write_idx(DIR_10K / "train-images-idx3-ubyte.gz", raw["x_train"][src_10k])
    write_idx(DIR_10K / "train-labels-idx1-ubyte.gz", raw["y_train"][src_10k])
    write_idx(DIR_10K / "t10k-images-idx3-ubyte.gz", raw["x_test"])
    write_idx(DIR_10K / "t10k-labels-idx1-ubyte.gz", raw["y_test"])
    checks = {}
    for n in (100, 1000, 10000):
        cfg = dataset_cfg(n)
        ds = run_dataset(cfg)
        parts = partitions(cfg)
        assert len(parts) == n and min(len(p) for p in parts) >= 1
        src = src_10k if n > 6000 else np.arange(6000)
        # the rows fedpriv's loader produced are the embedded images src[r]: check it
        assert np.array_equal(ds.y_train, raw["y_train"][src].astype(np.int64))
        idx = np.concatenate([src[p] for p in parts]).astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
        np.savez(DATA / f"split_{n}.npz", idx=idx, offsets=offsets)
        sizes = np.diff(offsets)
        x_users = np.concatenate([ds.x_train[p].reshape(len(p), -1) for p in parts])
        checks[str(n)] = {
            "dataset": cfg.dataset.name,
            "rows": int(len(ds.y_train)),
            "user_sizes": {"min": int(sizes.min()), "max": int(sizes.max())},
            "distinct_images": int(len(np.unique(idx))),
            "sha256_x_users": hashlib.sha256(
                np.ascontiguousarray(x_users, dtype=np.float32).tobytes()
            ).hexdigest(),
            "sha256_x_test": hashlib.sha256(
                np.ascontiguousarray(
                    ds.x_test.reshape(len(ds.x_test), -1), dtype=np.float32
                ).tobytes()
            ).hexdigest(),
        }
        print(n, checks[str(n)])
    model = build_model_for(dataset_cfg(100))
    np.savez(
        DATA / "init_state.npz", **{k: v.detach().numpy() for k, v in model.state_dict().items()}
    )
    (DATA / "checks.json").write_text(json.dumps(checks, indent=2))


if __name__ == "__main__":
    main()
