"""The Fashion-MNIST subset shipped inside the package (600 train + 100 test images per class).

The file ``fashion_mnist_6k_1k.npz`` is made by ``scripts/make_embedded_fmnist.py`` from the
official IDX files with :func:`build_subset`; ``PROVENANCE.txt`` beside it records source,
license (MIT) and checksums.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedpriv.common.errors import ConfigError, check
from fedpriv.data.arrays import ArrayDataset
from fedpriv.data.files import reading
from fedpriv.data.images import FASHION_MNIST_MEAN, FASHION_MNIST_STD, image_dataset

EMBEDDED_FILE = Path(__file__).with_name("fashion_mnist_6k_1k.npz")
EMBEDDED_KEYS = ("x_train", "y_train", "x_test", "y_test", "train_index", "test_index")
EMBEDDED_PROVENANCE = (
    "Fashion-MNIST (Xiao, Rasul, Vollgraf 2017, Zalando Research), license MIT (Copyright 2017 "
    "Zalando SE): the first 600 training and first 100 test images of each class of the official "
    "IDX files, official order (fedpriv/data/PROVENANCE.txt)."
)


def first_per_class(labels: np.ndarray, per_class: int, num_classes: int = 10) -> np.ndarray:
    """Sorted int32 indices of the first ``per_class`` rows of each class, in the file's order.

    Raises
    ------
    ConfigError
        If a class has fewer than ``per_class`` rows.
    """
    check(per_class >= 1, "per_class", per_class, "must be >= 1")
    picks = []
    for cls in range(num_classes):
        rows = np.flatnonzero(labels == cls)
        check(len(rows) >= per_class, f"class {cls}", len(rows), f"must have >= {per_class} rows")
        picks.append(rows[:per_class])
    return np.sort(np.concatenate(picks)).astype(np.int32)


def build_subset(
    arrays: dict[str, np.ndarray], per_class_train: int = 600, per_class_test: int = 100
) -> dict[str, np.ndarray]:
    """Select the embedded subset from the four official arrays (uint8 images and labels).

    Returns
    -------
    dict
        ``x_train`` (N, 28, 28) uint8, ``y_train`` (N,) uint8, ``x_test``, ``y_test``,
        ``train_index`` / ``test_index`` (int32 row numbers in the official files, sorted).
    """
    train_index = first_per_class(arrays["y_train"], per_class_train)
    test_index = first_per_class(arrays["y_test"], per_class_test)
    return {
        "x_train": np.ascontiguousarray(arrays["x_train"][train_index], dtype=np.uint8),
        "y_train": np.ascontiguousarray(arrays["y_train"][train_index], dtype=np.uint8),
        "x_test": np.ascontiguousarray(arrays["x_test"][test_index], dtype=np.uint8),
        "y_test": np.ascontiguousarray(arrays["y_test"][test_index], dtype=np.uint8),
        "train_index": train_index,
        "test_index": test_index,
    }


def read_embedded_arrays(path: str | Path = EMBEDDED_FILE) -> dict[str, np.ndarray]:
    """Raw uint8 arrays of the embedded file (keys :data:`EMBEDDED_KEYS`).

    Raises
    ------
    ConfigError
        If the package file is missing (a broken install: reinstall, or run ``make data``).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            "dataset.name",
            "fashion_mnist_embedded",
            f"needs the package file {path} (reinstall fedpriv or run `make data`)",
        )
    with reading(path), np.load(path) as data:
        return {key: data[key] for key in EMBEDDED_KEYS}


def load_fashion_mnist_embedded() -> ArrayDataset:
    """The embedded Fashion-MNIST subset: 6,000 train / 1,000 test, float32 ``(N, 1, 28, 28)``,
    standardized with the Fashion-MNIST constants of :mod:`fedpriv.data.images`."""
    return image_dataset(
        "fashion_mnist_embedded",
        read_embedded_arrays(),
        FASHION_MNIST_MEAN,
        FASHION_MNIST_STD,
        EMBEDDED_PROVENANCE,
    )
