"""The dataset container every loader returns: train/test arrays plus metadata."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedpriv.common.errors import ConfigError, check


@dataclass(frozen=True, eq=False)
class ArrayDataset:
    """A supervised dataset held in memory as numpy arrays.

    Parameters
    ----------
    name : str
        Registered dataset name, e.g. ``"fashion_mnist_embedded"``.
    x_train : np.ndarray
        Training features, float32, shape ``(N, *input_shape)``.
    y_train : np.ndarray
        Training labels, int64, shape ``(N,)``, values in ``[0, num_classes)``.
    x_test : np.ndarray
        Test features, float32, shape ``(M, *input_shape)``.
    y_test : np.ndarray
        Test labels, int64, shape ``(M,)``.
    num_classes : int
        Number of classes (2 for the binary tabular tasks).
    input_shape : tuple of int
        Shape of one example, e.g. ``(1, 28, 28)`` or ``(num_features,)``.
    groups_train : np.ndarray or None
        Natural client id per training row (int64, shape ``(N,)``), e.g. the US state for
        ACSIncome; ``None`` when the data has no natural split.
    provenance : str
        Source, version and license of the data, one paragraph.
    groups_test : np.ndarray or None
        Natural client id per test row (int64, shape ``(M,)``), or ``None``.
    group_names : tuple of str or None
        ``group_names[g]`` names group id ``g`` (e.g. ``"AL"``), or ``None``.
    feature_names : tuple of str or None
        Name of each feature column for tabular data, or ``None`` for images.

    Raises
    ------
    ConfigError
        If dtypes, shapes or label ranges are inconsistent.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    input_shape: tuple[int, ...]
    groups_train: np.ndarray | None = None
    provenance: str = ""
    groups_test: np.ndarray | None = None
    group_names: tuple[str, ...] | None = None
    feature_names: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        shape = tuple(int(d) for d in self.input_shape)
        object.__setattr__(self, "input_shape", shape)
        check(self.num_classes >= 2, "num_classes", self.num_classes, "must be >= 2")
        for split in ("train", "test"):
            x = getattr(self, f"x_{split}")
            y = getattr(self, f"y_{split}")
            check(x.dtype == np.float32, f"x_{split}.dtype", str(x.dtype), "must be float32")
            check(y.dtype == np.int64, f"y_{split}.dtype", str(y.dtype), "must be int64")
            check(x.shape[1:] == shape, f"x_{split}.shape", x.shape, f"must be (N, *{shape})")
            check(y.shape == (x.shape[0],), f"y_{split}.shape", y.shape, f"must be ({x.shape[0]},)")
            if y.size and (y.min() < 0 or y.max() >= self.num_classes):
                value = (int(y.min()), int(y.max()))
                raise ConfigError(f"y_{split}", value, f"must lie in [0, {self.num_classes})")
            groups = getattr(self, f"groups_{split}")
            if groups is not None:
                check(
                    groups.shape == (x.shape[0],),
                    f"groups_{split}.shape",
                    groups.shape,
                    f"must be ({x.shape[0]},)",
                )

    @property
    def num_train(self) -> int:
        """Number of training examples ``N``."""
        return int(self.x_train.shape[0])

    @property
    def num_test(self) -> int:
        """Number of test examples ``M``."""
        return int(self.x_test.shape[0])

    @property
    def license(self) -> str:
        """Alias of :attr:`provenance` (it states the license)."""
        return self.provenance

    def subset_train(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(x_train[indices], y_train[indices])`` for one client's index array."""
        idx = np.asarray(indices, dtype=np.int64)
        return self.x_train[idx], self.y_train[idx]
