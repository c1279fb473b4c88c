"""One copy of a large training set for every process of a run (memory-mapped ``.npy``).

Every Ray actor of a simulation loads the run's dataset. For a large set (e.g. 10^5 images,
314 MB as float32) that is one private copy per process. The driver instead writes the
loaded arrays once into a private folder (:func:`share`); every process that finds the folder
maps ``x_train`` read-only (:func:`load_shared`), so its pages are shared through the page
cache and counted once. The folder's name hashes the dataset config and the size and mtime
of every file in ``data_dir``, so changed files are never read from a stale copy; the driver
deletes it when the run ends (:func:`unshare`). Plain ``.npy`` files and JSON, read with
``allow_pickle=False``.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from fedpriv.data.arrays import ArrayDataset

#: Training sets at least this large (bytes of ``x_train``) are shared.
SHARE_BYTES = 32 << 20
_ARRAYS = ("y_train", "x_test", "y_test", "groups_train", "groups_test")
_META = ("name", "num_classes", "input_shape", "provenance", "group_names", "feature_names")


def shared_dir(dataset_json: str) -> Path:
    """The folder holding the shared copy of the dataset configured by ``dataset_json``."""
    key = hashlib.sha256(dataset_json.encode())
    node = json.loads(dataset_json)
    data_dir = node.get("fields", node).get("data_dir")
    if data_dir and Path(data_dir).is_dir():
        for f in sorted(Path(data_dir).rglob("*")):
            if f.is_file():
                st = f.stat()
                key.update(f"{f}:{st.st_size}:{st.st_mtime_ns}".encode())
    root = Path(tempfile.gettempdir()) / f"fedpriv-arrays-{os.getuid()}"
    return root / key.hexdigest()[:32]


def load_shared(dataset_json: str) -> ArrayDataset | None:
    """The dataset from its shared folder, ``x_train`` memory-mapped; ``None`` if absent."""
    folder = shared_dir(dataset_json)
    if not (folder / "done").is_file():
        return None
    meta = json.loads((folder / "meta.json").read_text())
    arrays: dict[str, Any] = {
        k: np.load(folder / f"{k}.npy", allow_pickle=False)
        if (folder / f"{k}.npy").is_file()
        else None
        for k in _ARRAYS
    }
    x_train = np.load(folder / "x_train.npy", mmap_mode="r", allow_pickle=False)
    for key in ("group_names", "feature_names", "input_shape"):
        if meta.get(key) is not None:
            meta[key] = tuple(meta[key])
    return ArrayDataset(x_train=x_train, **arrays, **meta)


def share(dataset_json: str, ds: ArrayDataset) -> Path | None:
    """Write ``ds`` to its shared folder (atomically) if it is large; the folder or ``None``."""
    if ds.x_train.nbytes < SHARE_BYTES:
        return None
    folder = shared_dir(dataset_json)
    if (folder / "done").is_file():
        return folder
    folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent))
    np.save(tmp / "x_train.npy", np.ascontiguousarray(ds.x_train), allow_pickle=False)
    for key in _ARRAYS:
        value = getattr(ds, key)
        if value is not None:
            np.save(tmp / f"{key}.npy", value, allow_pickle=False)
    meta = {k: getattr(ds, k) for k in _META}
    (tmp / "meta.json").write_text(json.dumps(meta))
    (tmp / "done").write_text("")
    try:
        tmp.rename(folder)
    except OSError:  # another run wrote it first
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def release_pages(array: np.ndarray) -> None:
    """Drop this process's mappings of a shared array's pages (``MADV_DONTNEED``; the data
    stays in the page cache and is faulted back on the next read). A worker calls it after
    copying out a round's client rows, so it never holds more of the set than it uses."""
    raw = getattr(array, "_mmap", None)
    if raw is not None and hasattr(raw, "madvise"):
        raw.madvise(mmap.MADV_DONTNEED)


def unshare(folder: Path | None) -> None:
    """Delete a shared folder written by :func:`share` (mapped copies stay valid)."""
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
