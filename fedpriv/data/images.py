"""Image loaders: Fashion-MNIST and MNIST from official IDX files, Fashion-MNIST from the Hub.

All images come out as float32 ``(N, 1, 28, 28)``, standardized with fixed per-dataset constants
(the mean and standard deviation of ``pixel / 255`` over the full official training set), so the
transform is a fixed public function that does not depend on the data loaded.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedpriv.common.errors import ConfigError, check
from fedpriv.data.arrays import ArrayDataset
from fedpriv.data.files import reading
from fedpriv.data.idx import read_idx

# mean / std of pixel/255 over the 60,000 official training images (measured: 0.28604, 0.35302).
FASHION_MNIST_MEAN = 0.2860
FASHION_MNIST_STD = 0.3530
# mean / std of pixel/255 over the 60,000 official MNIST training images (the usual constants).
MNIST_MEAN = 0.1307
MNIST_STD = 0.3081

DEBIAN_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
IDX_FILES = {
    "x_train": "train-images-idx3-ubyte.gz",
    "y_train": "train-labels-idx1-ubyte.gz",
    "x_test": "t10k-images-idx3-ubyte.gz",
    "y_test": "t10k-labels-idx1-ubyte.gz",
}
MNIST_FIRST10K_NPZ = "mnist_train_first10k.npz"

FASHION_MNIST_PROVENANCE = (
    "Fashion-MNIST (Xiao, Rasul, Vollgraf 2017, Zalando Research), official IDX files; "
    "license MIT (Copyright 2017 Zalando SE)."
)
MNIST_PROVENANCE = "MNIST (LeCun, Cortes, Burges), official IDX files; license CC BY-SA 3.0."


def standardize_images(images: np.ndarray, mean: float, std: float) -> np.ndarray:
    """Map uint8 images (N, 28, 28) to float32 (N, 1, 28, 28) as ``(x / 255 - mean) / std``."""
    x = images.astype(np.float32) / np.float32(255.0)
    x = (x - np.float32(mean)) / np.float32(std)
    return x[:, None, :, :].astype(np.float32, copy=False)


def image_dataset(
    name: str,
    arrays: dict[str, np.ndarray],
    mean: float,
    std: float,
    provenance: str,
) -> ArrayDataset:
    """Build an :class:`ArrayDataset` from uint8 images and integer labels (keys x/y_train/test)."""
    return ArrayDataset(
        name=name,
        x_train=standardize_images(arrays["x_train"], mean, std),
        y_train=arrays["y_train"].astype(np.int64),
        x_test=standardize_images(arrays["x_test"], mean, std),
        y_test=arrays["y_test"].astype(np.int64),
        num_classes=10,
        input_shape=(1, 28, 28),
        provenance=provenance,
    )


def _require_dir(data_dir: str | Path, expected: str) -> Path:
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise ConfigError("dataset.data_dir", str(path), f"is not a directory; expected {expected}")
    return path


def _limit(arrays: dict[str, np.ndarray], train_limit: int | None) -> dict[str, np.ndarray]:
    if train_limit is None:
        return arrays
    available = len(arrays["y_train"])
    check(
        1 <= int(train_limit) <= available,
        "dataset.train_limit",
        train_limit,
        f"must be in [1, {available}] (training images available)",
    )
    out = dict(arrays)
    out["x_train"] = arrays["x_train"][: int(train_limit)]
    out["y_train"] = arrays["y_train"][: int(train_limit)]
    return out


def read_idx_dir(data_dir: str | Path, expected: str) -> dict[str, np.ndarray]:
    """Read the four official IDX ``.gz`` files of a directory.

    Raises
    ------
    ConfigError
        If the directory or one of the four files is missing (message names path and remedy).
    """
    path = _require_dir(data_dir, expected)
    for fname in IDX_FILES.values():
        if not (path / fname).is_file():
            raise ConfigError("dataset.data_dir", str(path), f"lacks {fname}; expected {expected}")
    arrays = {key: read_idx(path / fname) for key, fname in IDX_FILES.items()}
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        check(
            len(y) == len(x),
            "idx_file",
            str(path / IDX_FILES[f"y_{split}"]),
            f"holds {len(y)} labels for the {len(x)} images of {IDX_FILES[f'x_{split}']}",
        )
    return arrays


def load_fashion_mnist(
    data_dir: str | Path | None = None, train_limit: int | None = None
) -> ArrayDataset:
    """Full Fashion-MNIST (60,000 train / 10,000 test) from the official IDX ``.gz`` files.

    Parameters
    ----------
    data_dir : str, Path or None
        Directory with ``{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz``; default the Debian
        package location ``/usr/share/datasets/fashion-mnist``.
    train_limit : int or None
        Keep only the first ``train_limit`` training images (official order).

    Raises
    ------
    ConfigError
        If the directory or a file is missing, or ``train_limit`` is out of range.
    """
    expected = (
        "the official Fashion-MNIST IDX .gz files "
        f"(e.g. `apt-get install dataset-fashion-mnist` puts them in {DEBIAN_FASHION_MNIST_DIR})"
    )
    arrays = _limit(read_idx_dir(data_dir or DEBIAN_FASHION_MNIST_DIR, expected), train_limit)
    return image_dataset(
        "fashion_mnist", arrays, FASHION_MNIST_MEAN, FASHION_MNIST_STD, FASHION_MNIST_PROVENANCE
    )


def load_mnist(data_dir: str | Path | None, train_limit: int | None = None) -> ArrayDataset:
    """MNIST from a directory: the four IDX ``.gz`` files, or the test IDX files plus
    ``mnist_train_first10k.npz`` (keys ``images`` uint8 (10000, 28, 28), ``labels``) when the
    training-image IDX file is absent.

    Parameters
    ----------
    data_dir : str or Path
        The directory (required).
    train_limit : int or None
        Keep only the first ``train_limit`` training images (official order).

    Raises
    ------
    ConfigError
        If the directory or the files are missing, the npz labels disagree with the official
        training labels, or ``train_limit`` is out of range.
    """
    expected = (
        "MNIST t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz and either "
        f"train-images-idx3-ubyte.gz + train-labels-idx1-ubyte.gz or {MNIST_FIRST10K_NPZ}"
    )
    if data_dir is None:
        raise ConfigError("dataset.data_dir", None, f"must name a directory with {expected}")
    path = _require_dir(data_dir, expected)
    if (path / IDX_FILES["x_train"]).is_file():
        arrays = read_idx_dir(path, expected)
    else:
        arrays = _mnist_from_npz(path, expected)
    arrays = _limit(arrays, train_limit)
    return image_dataset("mnist", arrays, MNIST_MEAN, MNIST_STD, MNIST_PROVENANCE)


def _mnist_from_npz(path: Path, expected: str) -> dict[str, np.ndarray]:
    npz = path / MNIST_FIRST10K_NPZ
    for fname in (IDX_FILES["x_test"], IDX_FILES["y_test"]):
        if not (path / fname).is_file():
            raise ConfigError("dataset.data_dir", str(path), f"lacks {fname}; expected {expected}")
    if not npz.is_file():
        raise ConfigError("dataset.data_dir", str(path), f"lacks {npz.name}; expected {expected}")
    with reading(npz), np.load(npz) as data:
        x_train, y_train = data["images"], data["labels"]
    labels_idx = path / IDX_FILES["y_train"]
    if labels_idx.is_file():
        official = read_idx(labels_idx)[: len(y_train)]
        if not np.array_equal(official, y_train):
            raise ConfigError(
                "dataset.data_dir", str(path), f"{npz.name} labels disagree with {labels_idx.name}"
            )
    return {
        "x_train": x_train,
        "y_train": y_train,
        "x_test": read_idx(path / IDX_FILES["x_test"]),
        "y_test": read_idx(path / IDX_FILES["y_test"]),
    }


def load_fashion_mnist_hf(
    train_limit: int | None = None, hf_dataset: str = "zalando-datasets/fashion_mnist"
) -> ArrayDataset:
    """Fashion-MNIST downloaded from the Hugging Face Hub through flwr-datasets (needs internet).

    Uses ``flwr_datasets.FederatedDataset`` with ``shuffle=False`` so rows keep the official
    order; partitioning is then done by :mod:`fedpriv.data.partition` like every other dataset.

    Raises
    ------
    ConfigError
        If flwr-datasets is not installed (``pip install 'fedpriv[datasets]'``).
    """
    try:
        from flwr_datasets import FederatedDataset
    except ImportError as err:
        raise ConfigError(
            "dataset.name",
            "fashion_mnist_hf",
            "needs flwr-datasets: pip install 'flwr-datasets[vision]' "
            "(or use fashion_mnist with the IDX files offline)",
        ) from err
    fds = FederatedDataset(dataset=hf_dataset, partitioners={"train": 1}, shuffle=False, seed=None)
    arrays: dict[str, np.ndarray] = {}
    for split in ("train", "test"):
        table = fds.load_split(split)
        arrays[f"x_{split}"] = np.stack([np.asarray(img, dtype=np.uint8) for img in table["image"]])
        arrays[f"y_{split}"] = np.asarray(table["label"], dtype=np.int64)
    arrays = _limit(arrays, train_limit)
    return image_dataset(
        "fashion_mnist_hf",
        arrays,
        FASHION_MNIST_MEAN,
        FASHION_MNIST_STD,
        FASHION_MNIST_PROVENANCE + f" Downloaded from the Hugging Face Hub ({hf_dataset}).",
    )
