"""Build fedpriv/data/fashion_mnist_6k_1k.npz from the official Fashion-MNIST IDX files.

Usage::

    python scripts/make_embedded_fmnist.py --idx-dir /usr/share/datasets/fashion-mnist

Selects the first 600 training and first 100 test images of each class (official order), writes
them with ``np.savez_compressed`` and prints the SHA-256 of the file and of the decompressed IDX
inputs for fedpriv/data/PROVENANCE.txt.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
from pathlib import Path

import numpy as np

from fedpriv.data.embedded import EMBEDDED_FILE, EMBEDDED_KEYS, build_subset
from fedpriv.data.images import IDX_FILES, read_idx_dir


def _md5_of_gz(path: Path) -> str:
    with gzip.open(path, "rb") as fh:
        return hashlib.md5(fh.read()).hexdigest()


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, build the subset, write it and print checksums."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idx-dir", required=True, help="directory with the four IDX .gz files")
    parser.add_argument("--out", default=str(EMBEDDED_FILE), help="output .npz path")
    parser.add_argument("--per-class-train", type=int, default=600)
    parser.add_argument("--per-class-test", type=int, default=100)
    args = parser.parse_args(argv)

    arrays = read_idx_dir(args.idx_dir, "the official Fashion-MNIST IDX .gz files")
    subset = build_subset(arrays, args.per_class_train, args.per_class_test)
    out = Path(args.out)
    np.savez_compressed(out, **{key: subset[key] for key in EMBEDDED_KEYS})
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    print(f"wrote {out} ({out.stat().st_size:,} B) sha256 {digest}")
    for key in EMBEDDED_KEYS:
        print(f"  {key}: {subset[key].shape} {subset[key].dtype}")
    for fname in IDX_FILES.values():
        print(f"  input {fname}: decompressed md5 {_md5_of_gz(Path(args.idx_dir) / fname)}")


if __name__ == "__main__":
    main()
