"""Datasets and client partitions.

``load_dataset(name, data_dir, **options)`` returns an :class:`ArrayDataset`; the partitioners
turn its training rows into per-client index arrays.

Names (``data_dir`` in brackets):

- ``fashion_mnist_embedded``: 600 train + 100 test images per class shipped in the package
  [not used].
- ``fashion_mnist``: official IDX ``.gz`` files [default /usr/share/datasets/fashion-mnist].
- ``mnist``: the four IDX ``.gz`` files, or the test IDX files + ``mnist_train_first10k.npz``
  [required].
- ``adult``: UCI Adult ``adult.data`` / ``adult.test`` [required].
- ``acs_income``: ACSIncome ``<ST>_*.csv.gz``, one natural client per state [required].
- ``cifar10``: CIFAR-10 JPEG archives (``subset=true``: 5k / 1k), cached decoded [required].
- ``fashion_mnist_hf``: Hugging Face Hub through flwr-datasets, needs internet [not used].
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedpriv.common.errors import ConfigError
from fedpriv.data.arrays import ArrayDataset
from fedpriv.data.cifar10 import load_cifar10
from fedpriv.data.embedded import load_fashion_mnist_embedded
from fedpriv.data.images import load_fashion_mnist, load_fashion_mnist_hf, load_mnist
from fedpriv.data.partition import partition_dirichlet, partition_iid, partition_natural
from fedpriv.data.tabular import load_acs_income, load_adult

_LOADERS: dict[str, Callable[..., ArrayDataset]] = {
    "fashion_mnist_embedded": lambda data_dir=None: load_fashion_mnist_embedded(),
    "fashion_mnist": load_fashion_mnist,
    "mnist": load_mnist,
    "adult": load_adult,
    "acs_income": load_acs_income,
    "cifar10": load_cifar10,
    "fashion_mnist_hf": lambda data_dir=None, **kw: load_fashion_mnist_hf(**kw),
}
DATASET_NAMES: tuple[str, ...] = tuple(_LOADERS)


def load_dataset(
    name: str = "fashion_mnist_embedded", data_dir: str | Path | None = None, **options: Any
) -> ArrayDataset:
    """Load a dataset by name.

    Parameters
    ----------
    name : str
        One of :data:`DATASET_NAMES`.
    data_dir : str, Path or None
        Directory holding the files (see the module table); ignored by the embedded data.
    **options
        Loader options (``None`` values count as unset): ``train_limit`` (fashion_mnist,
        mnist, fashion_mnist_hf); ``test_fraction``, ``seed``, ``states`` (acs_income);
        ``subset``, ``cache_dir`` (cifar10).

    Returns
    -------
    ArrayDataset

    Raises
    ------
    ConfigError
        Unknown name or option, missing directory or file, or an option out of range.
    """
    options = {key: value for key, value in options.items() if value is not None}
    data_dir = data_dir or None
    if name not in _LOADERS:
        raise ConfigError("dataset.name", name, f"must be one of: {', '.join(DATASET_NAMES)}")
    loader = _LOADERS[name]
    if name == "fashion_mnist_hf":
        allowed = set(inspect.signature(load_fashion_mnist_hf).parameters)
    else:
        allowed = set(inspect.signature(loader).parameters) - {"data_dir"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        listed = ", ".join(sorted(allowed)) or "none"
        raise ConfigError(
            f"dataset.{unknown[0]}",
            options[unknown[0]],
            f"is not an option of {name} (options: {listed})",
        )
    return loader(data_dir=data_dir, **options)


__all__ = [
    "DATASET_NAMES",
    "ArrayDataset",
    "load_dataset",
    "partition_dirichlet",
    "partition_iid",
    "partition_natural",
]
