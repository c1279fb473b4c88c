"""Split training rows among clients: IID, Dirichlet label skew, or natural groups.

Every partitioner returns a list of sorted int64 index arrays, one per client, disjoint and
covering every row exactly once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import overload

import numpy as np

from fedpriv.common.errors import ConfigError, check

MAX_DIRICHLET_TRIES = 1000


class PackedPartition(Sequence[np.ndarray]):
    """A partition held as ONE int64 index array plus offsets (cross-device scale: 10^5
    clients cost two arrays, not 10^5 array objects); ``parts[i]`` is a read-only view.

    Parameters
    ----------
    parts : sequence of np.ndarray
        One index array per client (as the partitioners return).
    """

    def __init__(self, parts: Sequence[np.ndarray]) -> None:
        sizes = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
        self._offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        flat = [np.asarray(p, dtype=np.int64) for p in parts]
        self._indices = np.concatenate(flat) if flat else np.zeros(0, dtype=np.int64)
        self._indices.setflags(write=False)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, i: int) -> np.ndarray: ...
    @overload
    def __getitem__(self, i: slice) -> list[np.ndarray]: ...
    def __getitem__(self, i: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        j = range(len(self))[i]  # IndexError for ids outside 0..len-1
        return self._indices[self._offsets[j] : self._offsets[j + 1]]


def _generator(rng: np.random.Generator | int | None) -> np.random.Generator:
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


def _check_num_clients(num_clients: int, num_samples: int) -> None:
    check(
        isinstance(num_clients, (int, np.integer)) and 1 <= num_clients <= num_samples,
        "num_clients",
        num_clients,
        f"must be an integer in [1, {num_samples}] (the number of training samples)",
    )


def partition_iid(
    num_samples: int, num_clients: int, rng: np.random.Generator | int | None = None
) -> list[np.ndarray]:
    """Shuffle ``num_samples`` row indices and deal them into ``num_clients`` near-equal parts.

    Parameters
    ----------
    num_samples : int
        Number of training rows N.
    num_clients : int
        Number of clients K, ``1 <= K <= N``.
    rng : np.random.Generator, int or None
        Randomness (a seed gives a reproducible partition).

    Returns
    -------
    list of np.ndarray
        K sorted int64 index arrays; sizes ``floor(N/K)`` or ``ceil(N/K)``.

    Raises
    ------
    ConfigError
        If ``num_clients`` is not in ``[1, num_samples]``.
    """
    check(num_samples >= 1, "num_samples", num_samples, "must be >= 1")
    _check_num_clients(num_clients, num_samples)
    perm = _generator(rng).permutation(num_samples).astype(np.int64)
    return [np.sort(part) for part in np.array_split(perm, int(num_clients))]


def _dirichlet_once(
    by_class: list[np.ndarray], num_clients: int, alpha: float, gen: np.random.Generator
) -> list[np.ndarray]:
    """One draw: each class's rows split by proportions p ~ Dir(alpha * 1_K)."""
    shares: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for rows in by_class:
        props = gen.dirichlet(np.full(num_clients, alpha))
        cuts = np.round(np.cumsum(props)[:-1] * len(rows)).astype(np.int64)
        for client, piece in enumerate(np.split(gen.permutation(rows), cuts)):
            shares[client].append(piece)
    return [np.sort(np.concatenate(s)).astype(np.int64) for s in shares]


def partition_dirichlet(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator | int | None = None,
    min_size: int = 1,
) -> list[np.ndarray]:
    """Label-skewed partition: each class is split among clients by Dirichlet proportions.

    For every class c an independent ``p_c ~ Dir(alpha, ..., alpha)`` over the K clients is
    drawn and the class's rows (in random order) are cut at the cumulative proportions. Small
    ``alpha`` gives clients dominated by few classes; ``alpha -> inf`` approaches IID. The whole
    draw is repeated until every client holds at least ``min_size`` rows.

    Parameters
    ----------
    labels : np.ndarray
        Integer class label per training row, shape (N,).
    num_clients : int
        Number of clients K, ``1 <= K <= N``.
    alpha : float
        Dirichlet concentration, > 0.
    rng : np.random.Generator, int or None
        Randomness (a seed gives a reproducible partition).
    min_size : int
        Fewest rows any client may hold, ``0 <= min_size <= N / K``; 0 disables resampling.

    Returns
    -------
    list of np.ndarray
        K sorted int64 index arrays, disjoint, covering ``range(N)``.

    Raises
    ------
    ConfigError
        If an argument is out of range, or no draw in :data:`MAX_DIRICHLET_TRIES` satisfies
        ``min_size`` (raise ``alpha`` or lower ``min_size``).

    References
    ----------
    T.-M. H. Hsu, H. Qi, M. Brown, "Measuring the effects of non-identical data distribution for
    federated visual classification", 2019, Sec. 3 (Dirichlet label skew); M. Yurochkin et al.,
    "Bayesian nonparametric federated learning of neural networks", ICML 2019.
    """
    labels = np.asarray(labels)
    check(labels.ndim == 1 and labels.size >= 1, "labels.shape", labels.shape, "must be (N,), N>=1")
    _check_num_clients(num_clients, labels.size)
    check(math.isfinite(alpha) and alpha > 0, "alpha", alpha, "must be a finite number > 0")
    check(
        0 <= min_size <= labels.size // num_clients,
        "partition.min_size",
        min_size,
        f"must be in [0, {labels.size // num_clients}] ({labels.size} training records // "
        f"num_clients={num_clients}): lower it or use fewer clients",
    )
    gen = _generator(rng)
    by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    for _ in range(MAX_DIRICHLET_TRIES):
        parts = _dirichlet_once(by_class, int(num_clients), float(alpha), gen)
        if min(len(p) for p in parts) >= min_size:
            return parts
    raise ConfigError(
        "partition.alpha",
        alpha,
        f"gave a client fewer than min_size={min_size} rows in {MAX_DIRICHLET_TRIES} draws "
        f"with num_clients={num_clients}; raise alpha or lower min_size",
    )


def partition_natural(groups: np.ndarray) -> list[np.ndarray]:
    """One client per distinct value of ``groups``, clients ordered by sorted group value.

    Parameters
    ----------
    groups : np.ndarray
        Natural client id per training row, shape (N,) (e.g. ``ArrayDataset.groups_train``).

    Returns
    -------
    list of np.ndarray
        Sorted int64 row indices of each group, in ascending order of the group value.

    Raises
    ------
    ConfigError
        If ``groups`` is not a non-empty 1-d array.
    """
    groups = np.asarray(groups)
    check(groups.ndim == 1 and groups.size >= 1, "groups.shape", groups.shape, "must be (N,), N>=1")
    order = np.argsort(groups, kind="stable").astype(np.int64)
    _, starts = np.unique(groups[order], return_index=True)
    return [np.sort(part) for part in np.split(order, starts[1:])]
