"""Client sampling: which registered clients train in a server round (the cohort).

The server draws the cohort from its own generator, seeded by ``(seed, server_round)``; a
client's data never influences it. ``all``: every registered client; ``poisson``: each client
independently with probability ``client_sample_rate``; ``fixed_size``: ``num_sampled_clients``
clients uniformly without replacement; ``random_allocation``: every client takes part in
``rounds_per_client`` k of each epoch of ``allocation_window`` t rounds, the k rounds chosen
uniformly by the client itself (in the simulation, from a stream that depends on the epoch and
the client only, never on data or on other clients).

Privacy. The privacy unit of fedpriv's record-level client algorithms is one training record,
and a client holds many. Sampling clients then amplifies nothing that fedpriv can claim: the
cohort is known to the server, and a record's client being absent changes the release by that
client's WHOLE update, which the record-level noise does not bound, so the subsampling theorems
(which need the absent case to differ from the present one by one record) do not apply. Each
round is therefore accounted with the algorithm's events for the clients that actually
contributed (``degraded_round_events`` when fewer than the nominal cohort), as for dropouts.
Client-level analyses, where the client is the unit, are what Poisson-subsampled and
sampled-without-replacement events are for; no fedpriv algorithm declares them yet, so none is
applied.

References
----------
Balle, Barthe, Gaboardi, "Privacy Amplification by Subsampling: Tight Analyses via Couplings
and Divergences" (arXiv:1807.01647), Thm. 8-10 (what subsampling needs of the neighbouring
pair); McMahan et al., "Learning Differentially Private Recurrent Language Models"
(arXiv:1710.06963), Sec. 2 (client sampling in DP-FedAvg, client-level unit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

import numpy as np

from fedpriv.common.errors import check

_COHORT_STREAM = 0xC0407


class ClientSampling(StrEnum):
    """How a round's cohort is drawn out of ``num_clients`` registered clients."""

    ALL = "all"
    POISSON = "poisson"
    FIXED_SIZE = "fixed_size"
    RANDOM_ALLOCATION = "random_allocation"


@dataclass(frozen=True)
class CohortSampler:
    """Draws each round's cohort; states its public size for the divisor and the noise shares.

    Parameters
    ----------
    num_clients : int
        Registered clients ``N`` (ids ``0..N-1``).
    client_sampling : ClientSampling
        ``all``, ``poisson`` or ``fixed_size``.
    client_sample_rate : float | None
        Poisson inclusion probability ``q`` in (0, 1]; only with ``poisson``.
    num_sampled_clients : int | None
        Cohort size ``k`` in ``1..N``; only with ``fixed_size``.
    allocation_window : int | None
        Rounds per epoch ``t`` >= 1; only with ``random_allocation``.
    rounds_per_client : int | None
        Rounds each client takes part in per epoch, ``k`` in ``1..t``; only with
        ``random_allocation``.
    seed : int
        The run's seed (the cohort of round ``r`` is a function of ``(seed, r)``).

    Raises
    ------
    ConfigError
        For a rate outside (0, 1], ``k`` outside ``1..N``, or a parameter given to the wrong
        sampling (one line naming the field and value).
    """

    num_clients: int
    client_sampling: ClientSampling = ClientSampling.ALL
    client_sample_rate: float | None = None
    num_sampled_clients: int | None = None
    allocation_window: int | None = None
    rounds_per_client: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        from fedpriv.common.validate import parse_enum

        kind = parse_enum(ClientSampling, "client_sampling", self.client_sampling)
        object.__setattr__(self, "client_sampling", kind)
        check(self.num_clients >= 1, "num_clients", self.num_clients, "must be >= 1")
        q, k = self.client_sample_rate, self.num_sampled_clients
        if kind is ClientSampling.POISSON:
            check(
                q is not None,
                "client_sample_rate",
                q,
                "is not set: give client_sample_rate=Q in (0, 1] with client_sampling=poisson",
            )
            assert q is not None
            check(math.isfinite(q) and 0 < q <= 1, "client_sample_rate", q, "must be in (0, 1]")
        else:
            check(q is None, "client_sample_rate", q, f"needs client_sampling=poisson (not {kind})")
        if kind is ClientSampling.FIXED_SIZE:
            check(
                k is not None,
                "num_sampled_clients",
                k,
                "is not set: give num_sampled_clients=K in 1..num_clients with "
                "client_sampling=fixed_size",
            )
            assert k is not None
            check(
                1 <= k <= self.num_clients,
                "num_sampled_clients",
                k,
                f"must be in 1..num_clients={self.num_clients}",
            )
        else:
            check(
                k is None,
                "num_sampled_clients",
                k,
                f"needs client_sampling=fixed_size (not {kind})",
            )
        self._check_allocation(kind)

    def _check_allocation(self, kind: ClientSampling) -> None:
        t, k = self.allocation_window, self.rounds_per_client
        if kind is not ClientSampling.RANDOM_ALLOCATION:
            for name, v in (("allocation_window", t), ("rounds_per_client", k)):
                check(v is None, name, v, f"needs client_sampling=random_allocation (not {kind})")
            return
        check(
            isinstance(t, int) and t >= 1,
            "allocation_window",
            t,
            "must be an integer >= 1 (rounds per epoch) with client_sampling=random_allocation",
        )
        check(
            isinstance(k, int) and 1 <= k <= int(t),  # type: ignore[arg-type]
            "rounds_per_client",
            k,
            f"must be an integer in 1..allocation_window={t} (k <= t)",
        )

    def epoch_of(self, server_round: int) -> int | None:
        """The random-allocation epoch (0-based) of ``server_round``; ``None`` otherwise."""
        if self.client_sampling is not ClientSampling.RANDOM_ALLOCATION:
            return None
        return (int(server_round) - 1) // int(self.allocation_window)  # type: ignore[arg-type]

    @property
    def expected_size(self) -> float:
        """Public expected cohort size: ``N``, ``q N`` or ``k`` (the server's mean divisor)."""
        if self.client_sampling is ClientSampling.POISSON:
            return float(self.client_sample_rate) * self.num_clients  # type: ignore[arg-type]
        if self.client_sampling is ClientSampling.FIXED_SIZE:
            return float(self.num_sampled_clients)  # type: ignore[arg-type]
        if self.client_sampling is ClientSampling.RANDOM_ALLOCATION:
            return self.num_clients * self.rounds_per_client / self.allocation_window  # type: ignore[operator]
        return float(self.num_clients)

    @property
    def nominal_size(self) -> int:
        """Clients whose noise a full round's sum holds: ``N``, ``k``, or ``max(1, floor(qN))``.

        The client algorithm sizes its noise shares by it; a Poisson round with fewer
        contributors is accounted with ``degraded_round_events`` for the actual count.
        """
        return max(1, math.floor(self.expected_size + 1e-9))

    @property
    def varies(self) -> bool:
        """Whether the cohort size can differ from :attr:`nominal_size` (Poisson, allocation)."""
        return self.client_sampling in (ClientSampling.POISSON, ClientSampling.RANDOM_ALLOCATION)

    def draw(self, server_round: int) -> np.ndarray:
        """Sorted int64 client ids of round ``server_round``'s cohort (may be empty: Poisson)."""
        n = self.num_clients
        if self.client_sampling is ClientSampling.ALL:
            return np.arange(n, dtype=np.int64)
        if self.client_sampling is ClientSampling.RANDOM_ALLOCATION:
            t = int(self.allocation_window)  # type: ignore[arg-type]
            epoch = (int(server_round) - 1) // t
            chosen = _allocation(self.seed, n, t, int(self.rounds_per_client), epoch)  # type: ignore[arg-type]
            return np.flatnonzero((chosen == (int(server_round) - 1) % t).any(axis=1)).astype(
                np.int64
            )
        seq = np.random.SeedSequence(
            [int(self.seed), int(server_round)], spawn_key=(_COHORT_STREAM,)
        )  # a spawn key: no client's (seed, round, id) seed can equal it
        rng = np.random.default_rng(seq)
        if self.client_sampling is ClientSampling.POISSON:
            q = float(self.client_sample_rate)  # type: ignore[arg-type]
            return np.flatnonzero(rng.random(n) < q).astype(np.int64)
        k = int(self.num_sampled_clients)  # type: ignore[arg-type]
        return np.sort(rng.choice(n, size=k, replace=False)).astype(np.int64)


_ALLOCATION_STREAM = 0xA110C


@lru_cache(maxsize=2)
def _allocation(seed: int, num_clients: int, t: int, k: int, epoch: int) -> np.ndarray:
    """``(num_clients, k)``: the rounds (0..t-1 within ``epoch``) each client chose, uniformly
    without replacement, from a stream of ``(seed, epoch)`` (row ``i``: client ``i``'s)."""
    seq = np.random.SeedSequence([int(seed), epoch], spawn_key=(_ALLOCATION_STREAM,))
    rng = np.random.default_rng(seq)
    if k == 1:
        return rng.integers(0, t, size=(num_clients, 1))
    if num_clients * t <= 1 << 24:  # the k smallest of t uniform keys: a uniform k-subset
        return np.argsort(rng.random((num_clients, t)), axis=1)[:, :k]
    return np.stack([rng.choice(t, size=k, replace=False) for _ in range(num_clients)])
