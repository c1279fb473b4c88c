"""Client sampling: which registered clients train in a server round (the cohort).

The server draws the cohort from its own generator, seeded by ``(seed, server_round)``; a
client's data never influences it. ``all``: every registered client; ``poisson``: each client
independently with probability ``client_sample_rate``; ``fixed_size``: ``num_sampled_clients``
clients uniformly without replacement.

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

import numpy as np

from fedpriv.errors import check

_COHORT_STREAM = 0xC0407


class ClientSampling(StrEnum):
    """How a round's cohort is drawn out of ``num_clients`` registered clients."""

    ALL = "all"
    POISSON = "poisson"
    FIXED_SIZE = "fixed_size"


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
    seed: int = 0

    def __post_init__(self) -> None:
        from fedpriv.accounting.spec import parse_enum

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

    @property
    def expected_size(self) -> float:
        """Public expected cohort size: ``N``, ``q N`` or ``k`` (the server's mean divisor)."""
        if self.client_sampling is ClientSampling.POISSON:
            return float(self.client_sample_rate) * self.num_clients  # type: ignore[arg-type]
        if self.client_sampling is ClientSampling.FIXED_SIZE:
            return float(self.num_sampled_clients)  # type: ignore[arg-type]
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
        """Whether the cohort size can differ from :attr:`nominal_size` (Poisson)."""
        return self.client_sampling is ClientSampling.POISSON

    def draw(self, server_round: int) -> np.ndarray:
        """Sorted int64 client ids of round ``server_round``'s cohort (may be empty: Poisson)."""
        n = self.num_clients
        if self.client_sampling is ClientSampling.ALL:
            return np.arange(n, dtype=np.int64)
        seq = np.random.SeedSequence(
            [int(self.seed), int(server_round)], spawn_key=(_COHORT_STREAM,)
        )  # a spawn key: no client's (seed, round, id) seed can equal it
        rng = np.random.default_rng(seq)
        if self.client_sampling is ClientSampling.POISSON:
            q = float(self.client_sample_rate)  # type: ignore[arg-type]
            return np.flatnonzero(rng.random(n) < q).astype(np.int64)
        k = int(self.num_sampled_clients)  # type: ignore[arg-type]
        return np.sort(rng.choice(n, size=k, replace=False)).astype(np.int64)
