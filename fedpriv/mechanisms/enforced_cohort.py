"""Server-enforced participation for DP-FTRL: the cohort can never break the accounted pattern.

A correlated-noise (matrix-factorization) mechanism is accounted for a bounded participation
pattern (:class:`~fedpriv.mechanisms.participation.Participation`), not for the sampler that
proposes the cohort. :class:`EnforcedCohort` takes the sampler's proposal for round ``t``
(:meth:`CohortSampler.draw <fedpriv.mechanisms.client_sampling.CohortSampler.draw>`),
keeps the clients that are available in ``t`` (:class:`AvailabilityTrace` or
:class:`ExplicitAvailability`, both data-independent) and then removes every client whose
participation would break the pattern:

- ``single``: a client that took part once is excluded for the rest of the run;
- ``min_separation`` (k, b): a client is excluded for the b - 1 rounds after it takes part and
  once it has taken part k times;
- ``cyclic_poisson`` (b, q): the clients are split into b groups by a public, seeded
  permutation (:func:`cyclic_groups`, fixed for the run) and round t keeps only group
  (t - 1) mod b: the run's sampler is Poisson at rate q over every client (the same draws as
  DP-FedAvg's Poisson cohort), so each member of the round's group takes part independently
  with probability q.

A client counts as having taken part in round t as soon as it is in the enforced cohort of t,
whether or not it replies (conservative: a dropout still uses up a participation).

Replay. The cohort of round t is a deterministic function of ``(seed, t)``: the enforcement
state (per-client counts and last rounds) is rebuilt by replaying rounds 1..t-1, so a resumed
run restores it without a checkpoint (:meth:`EnforcedCohort.draw`).

Availability and amplification. Enforcement bounds the participation pattern whatever proposes
the cohort, so ``single`` and ``min_separation`` hold for any sampler and any availability. For
``cyclic_poisson`` a client that is unavailable in its group's round is removed after the
Poisson draw: its inclusion probability is then q or 0, decided without its data, and the
Poisson-subsampled Gaussian's privacy profile is non-decreasing in the rate (each hockey-stick
divergence is convex in q and 0 at q = 0), so the accounted rate q stays an upper bound.

References
----------
Choquette-Choo, McMahan, Rush, Thakurta, "Multi-Epoch Matrix Factorization Mechanisms for
Private Machine Learning" (arXiv:2211.06530), Sec. 2 (b-min-separated participation, at most k
participations); Choquette-Choo, Ganesh, McKenna, McMahan, Rush, Thakurta, Xu, "(Amplified)
Banded Matrix Factorization: A unified approach to private training" (arXiv:2306.08153), Sec. 4
(cyclic Poisson sampling over b fixed groups).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from fedpriv.common.errors import check
from fedpriv.mechanisms.client_sampling import ClientSampling, CohortSampler
from fedpriv.mechanisms.participation import Participation, ParticipationKind

_GROUP_STREAM = 0x6C0B5
_AVAILABILITY_STREAM = 0xA7A11
_NEVER = np.iinfo(np.int64).min // 2  # "last round" of a client that has not taken part


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


class Availability(Protocol):
    """Which clients can be reached in a round: a public, data-independent boolean mask."""

    def available(self, server_round: int, num_clients: int) -> NDArray[np.bool_]:
        """Boolean mask of length ``num_clients``: ``True`` where client ``i`` is available."""
        ...


@lru_cache(maxsize=4)
def _diurnal(
    seed: int, period: int, fraction: float, num_clients: int
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Per-client ``(offset, window)`` of :class:`AvailabilityTrace` (read-only arrays)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed], spawn_key=(_AVAILABILITY_STREAM,)))
    offsets = rng.integers(0, period, size=num_clients).astype(np.int64)
    windows = rng.binomial(period, fraction, size=num_clients).astype(np.int64)
    offsets.setflags(write=False)
    windows.setflags(write=False)
    return offsets, windows


@dataclass(frozen=True)
class AvailabilityTrace:
    """A simulated, seeded, diurnal device availability (independent of any client's data).

    Each client ``i`` has a daily window: it is available in round ``t`` iff
    ``(t + offset_i) mod period < window_i``. The offsets are uniform on ``0..period-1`` (a
    population spread over time zones); the windows are ``Binomial(period, available_fraction)``
    (mean ``available_fraction * period`` rounds a day; a window of 0 is a device that is never
    reachable, of ``period`` one that always is). Both are drawn per client from ``seed``.

    Parameters
    ----------
    period : int
        Rounds per "day", >= 1.
    available_fraction : float
        Mean fraction of a day a client is available, in (0, 1].
    seed : int
        Seed of the offsets and windows (a public, data-independent number).

    Raises
    ------
    ConfigError
        For a period < 1, a fraction outside (0, 1] or a seed that is not an integer (one line
        naming ``availability.<field>``).

    References
    ----------
    Choquette-Choo et al. (arXiv:2306.08153), Sec. 4 (device availability and why the server
    must enforce the participation pattern).
    """

    period: int
    available_fraction: float
    seed: int = 0

    def __post_init__(self) -> None:
        p, f = self.period, self.available_fraction
        check(_is_int(p) and p >= 1, "availability.period", p, "must be an integer >= 1")
        ok = isinstance(f, (int, float)) and not isinstance(f, bool) and math.isfinite(f)
        check(ok and 0 < f <= 1, "availability.available_fraction", f, "must be in (0, 1]")
        check(_is_int(self.seed), "availability.seed", self.seed, "must be an integer")

    def windows(self, num_clients: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Per-client ``(offset, window)`` arrays (read-only) for ``num_clients`` clients."""
        check(_is_int(num_clients) and num_clients >= 1, "num_clients", num_clients, "must be >= 1")
        return _diurnal(
            int(self.seed), int(self.period), float(self.available_fraction), int(num_clients)
        )

    def available(self, server_round: int, num_clients: int) -> NDArray[np.bool_]:
        """Boolean mask of the clients available in ``server_round`` (1-based).

        Raises
        ------
        ConfigError
            For ``num_clients`` < 1.
        """
        offsets, windows = self.windows(num_clients)
        phase: NDArray[np.int64] = (int(server_round) + offsets) % int(self.period)
        return phase < windows


@dataclass(frozen=True, eq=False)
class ExplicitAvailability:
    """An explicit availability trace: a ``(num_rounds, num_clients)`` boolean array.

    Row ``t - 1`` is the mask of round ``t``. Load a recorded trace with :meth:`from_npy`.

    Parameters
    ----------
    mask : numpy.ndarray
        2-D array of bools (or of 0/1 integers), one row per round, one column per client;
        stored as a read-only bool copy.

    Raises
    ------
    ConfigError
        For an array that is not 2-D, is empty, or holds values other than 0/1 (one line naming
        ``availability.mask``); :meth:`available` for a round past the trace's end or a client
        count that differs from its columns.

    References
    ----------
    Choquette-Choo et al. (arXiv:2306.08153), Sec. 4.
    """

    mask: NDArray[np.bool_] = field(repr=False)

    def __post_init__(self) -> None:
        arr = np.asarray(self.mask)
        shape = getattr(arr, "shape", None)
        check(
            arr.ndim == 2 and arr.size > 0,
            "availability.mask",
            shape,
            "must be a non-empty 2-D array (num_rounds, num_clients)",
        )
        ok = arr.dtype == np.bool_ or (
            np.issubdtype(arr.dtype, np.integer) and bool(np.isin(arr, (0, 1)).all())
        )
        check(ok, "availability.mask", str(arr.dtype), "must hold bools or 0/1 integers")
        stored = arr.astype(np.bool_, copy=True)
        stored.setflags(write=False)
        object.__setattr__(self, "mask", stored)

    @classmethod
    def from_npy(cls, path: str | Path) -> ExplicitAvailability:
        """Load a ``(num_rounds, num_clients)`` bool array saved with :func:`numpy.save`.

        Raises
        ------
        ConfigError
            For a missing file or an array of the wrong shape or type.
        """
        p = Path(path)
        check(p.is_file(), "availability.path", str(p), "must be an existing .npy file")
        return cls(np.load(p, allow_pickle=False))

    @property
    def num_rounds(self) -> int:
        """Rounds the trace covers."""
        return int(self.mask.shape[0])

    @property
    def num_clients(self) -> int:
        """Clients the trace covers."""
        return int(self.mask.shape[1])

    def available(self, server_round: int, num_clients: int) -> NDArray[np.bool_]:
        """Row ``server_round - 1`` of the trace (read-only).

        Raises
        ------
        ConfigError
            For a round outside ``1..num_rounds`` or ``num_clients`` != the trace's columns.
        """
        t = int(server_round)
        check(
            1 <= t <= self.num_rounds,
            "availability.num_rounds",
            self.num_rounds,
            f"is too short: the trace has no round {t}",
        )
        check(
            num_clients == self.num_clients,
            "availability.num_clients",
            self.num_clients,
            f"must equal num_clients={num_clients}",
        )
        row: NDArray[np.bool_] = self.mask[t - 1]
        return row


def cyclic_groups(num_clients: int, num_groups: int, seed: int) -> NDArray[np.int64]:
    """The public partition of ``cyclic_poisson``: group (0..num_groups-1) of each client.

    A seeded permutation of the ids is dealt round-robin, so the group sizes differ by at most
    one; the groups depend only on ``(seed, num_clients, num_groups)``.

    Raises
    ------
    ConfigError
        For ``num_clients`` or ``num_groups`` < 1.

    References
    ----------
    Choquette-Choo et al. (arXiv:2306.08153), Sec. 4 (cyclic Poisson sampling).
    """
    check(_is_int(num_clients) and num_clients >= 1, "num_clients", num_clients, "must be >= 1")
    check(
        _is_int(num_groups) and num_groups >= 1,
        "privacy.min_separation",
        num_groups,
        "must be an integer >= 1",
    )
    rng = np.random.default_rng(np.random.SeedSequence([int(seed)], spawn_key=(_GROUP_STREAM,)))
    groups = np.empty(int(num_clients), dtype=np.int64)
    groups[rng.permutation(int(num_clients))] = np.arange(int(num_clients)) % int(num_groups)
    return groups


class EnforcedCohort:
    """The server's enforcement of a participation pattern over a sampler's proposals.

    Parameters
    ----------
    sampler : CohortSampler
        Proposes each round's cohort (``all``, ``poisson``, ``fixed_size`` or
        ``random_allocation``; only ``all`` with ``cyclic_poisson``).
    participation : Participation
        The pattern the accountant assumes; no cohort returned by :meth:`draw` can break it.
    availability : Availability, optional
        Public, data-independent availability (:class:`AvailabilityTrace`,
        :class:`ExplicitAvailability`); ``None``: every client is always available.
    seed : int
        The run's seed: the cyclic groups and the cyclic Poisson draws depend on it (the other
        kinds take the sampler's proposal, seeded by ``sampler.seed``).

    Raises
    ------
    ConfigError
        For ``cyclic_poisson`` with a sampler other than ``all``, an explicit availability whose
        client count differs from the sampler's, or a seed that is not an integer (one line
        naming the field).

    References
    ----------
    Choquette-Choo et al. (arXiv:2211.06530), Sec. 2; Choquette-Choo et al.
    (arXiv:2306.08153), Sec. 4.
    """

    def __init__(
        self,
        sampler: CohortSampler,
        participation: Participation,
        *,
        availability: Availability | None = None,
        seed: int,
    ) -> None:
        check(_is_int(seed), "seed", seed, "must be an integer")
        kind = participation.kind
        if kind is ParticipationKind.CYCLIC_POISSON:
            check(
                sampler.client_sampling is ClientSampling.POISSON
                and sampler.client_sample_rate == participation.client_sample_rate,
                "client_sampling",
                str(sampler.client_sampling),
                "must be poisson with privacy.participation=cyclic_poisson (client_sample_rate "
                "is the rate within the round's group; the server keeps that group only)",
            )
        if isinstance(availability, ExplicitAvailability):
            check(
                availability.num_clients == sampler.num_clients,
                "availability.num_clients",
                availability.num_clients,
                f"must equal num_clients={sampler.num_clients}",
            )
        self.sampler = sampler
        self.participation = participation
        self.availability = availability
        self.seed = int(seed)
        n = sampler.num_clients
        self._groups: NDArray[np.int64] | None = None
        if kind is ParticipationKind.CYCLIC_POISSON:
            self._groups = cyclic_groups(n, participation.separation, self.seed)
            self._groups.setflags(write=False)
        self._cap = {
            ParticipationKind.SINGLE: 1,
            ParticipationKind.MIN_SEPARATION: int(participation.max_participations or 1),
            ParticipationKind.CYCLIC_POISSON: np.iinfo(np.int64).max,
        }[kind]
        self._expected: dict[int, float] = {}
        #: Rounds of the last dry run (:meth:`expected_cohort_size`) whose cohort is empty.
        self.empty_rounds = 0
        self._reset()

    def _reset(self) -> None:
        n = self.sampler.num_clients
        self._round = 0
        self._counts = np.zeros(n, dtype=np.int64)
        self._last = np.full(n, _NEVER, dtype=np.int64)
        self._cohort: NDArray[np.int64] = np.empty(0, dtype=np.int64)

    @property
    def num_clients(self) -> int:
        """Registered clients ``N``."""
        return self.sampler.num_clients

    @property
    def last_round(self) -> int:
        """The last round drawn (0 before the first)."""
        return self._round

    @property
    def groups(self) -> NDArray[np.int64] | None:
        """Group of each client under ``cyclic_poisson`` (read-only); ``None`` otherwise."""
        return self._groups

    def _proposal(self, t: int) -> NDArray[np.int64]:
        n = self.num_clients
        ids = np.asarray(self.sampler.draw(t), dtype=np.int64)
        if self._groups is not None:  # Poisson-q over everyone, then the round's group only
            ids = ids[self._groups[ids] == (t - 1) % self.participation.separation]
        if self.availability is not None:
            mask = np.asarray(self.availability.available(t, n), dtype=np.bool_)
            ids = ids[mask[ids]]
        return ids

    def _step(self, t: int) -> None:
        ids = self._proposal(t)
        if self._groups is None:  # single / min_separation: cap and separation from the state
            b = self.participation.separation
            ok = (self._counts[ids] < self._cap) & (t - self._last[ids] >= b)
            ids = ids[ok]
        self._counts[ids] += 1
        self._last[ids] = t
        self._round = t
        self._cohort = ids

    def draw(self, server_round: int) -> NDArray[np.int64]:
        """Sorted int64 ids of the enforced cohort of ``server_round`` (may be empty).

        A deterministic function of ``(seed, server_round)``: a round past the next is reached
        by replaying the rounds in between; the last round again returns the same ids; an
        earlier round restarts the replay from round 1.

        Raises
        ------
        ConfigError
            For a round that is not an integer >= 1.
        """
        t = server_round
        check(_is_int(t) and t >= 1, "server_round", t, "must be an integer >= 1")
        t = int(t)
        if t < self._round:
            self._reset()
        while self._round < t:
            self._step(self._round + 1)
        return self._cohort.copy()

    def participations(self) -> NDArray[np.int64]:
        """Rounds each client has taken part in over rounds ``1..last_round`` (a copy)."""
        return self._counts.copy()

    def expected_cohort_size(self, num_rounds: int) -> float:
        """Mean size of the NON-EMPTY enforced cohorts of rounds ``1..num_rounds`` (a round
        with an empty cohort releases nothing), by a dry run; 0 if every cohort is empty.

        The dry run uses a separate instance (this one's state is untouched); the result depends
        only on the public configuration and seed, never on data: it is the public divisor of
        the noisy mean.

        Raises
        ------
        ConfigError
            For ``num_rounds`` < 1, or an explicit availability shorter than ``num_rounds``.
        """
        check(_is_int(num_rounds) and num_rounds >= 1, "num_rounds", num_rounds, "must be >= 1")
        n = int(num_rounds)
        if n not in self._expected:
            dry = EnforcedCohort(
                self.sampler, self.participation, availability=self.availability, seed=self.seed
            )
            sizes = []
            for t in range(1, n + 1):
                dry._step(t)
                sizes.append(int(dry._cohort.size))
            self.empty_rounds = sum(1 for x in sizes if x == 0)
            nonempty = [x for x in sizes if x]
            self._expected[n] = sum(nonempty) / len(nonempty) if nonempty else 0.0
        return self._expected[n]


class PatternViolation(Exception):
    """A cohort history breaks the participation pattern.

    Parameters
    ----------
    client : int
        The offending client id.
    rounds : tuple of int
        The rounds (1-based) the client took part in, up to the violation.
    reason : str
        What was broken.
    """

    def __init__(self, client: int, rounds: tuple[int, ...], reason: str) -> None:
        self.client = client
        self.rounds = rounds
        self.reason = reason
        super().__init__(f"client {client} in rounds {list(rounds)}: {reason}")


def check_pattern(
    history: Sequence[NDArray[np.int64]] | Sequence[Sequence[int]],
    participation: Participation,
    *,
    groups: NDArray[np.int64] | None = None,
) -> None:
    """Verify that the cohorts of rounds ``1..len(history)`` obey ``participation``.

    ``single``: each client at most once; ``min_separation``: at most k times, any two
    participations at least b rounds apart; ``cyclic_poisson``: any two participations a
    multiple of b apart (one residue class of rounds per client) and, with ``groups``, every
    client only in rounds ``t`` with ``(t - 1) mod b == groups[client]``. A client listed twice
    in one round is a violation too.

    Parameters
    ----------
    history : sequence of array_like of int
        ``history[t - 1]``: the client ids of round ``t``'s cohort.
    participation : Participation
        The pattern.
    groups : numpy.ndarray, optional
        The public cyclic partition (:attr:`EnforcedCohort.groups`), checked with
        ``cyclic_poisson`` only.

    Raises
    ------
    PatternViolation
        Naming the first client (by round) that breaks the pattern and its rounds.

    References
    ----------
    Choquette-Choo et al. (arXiv:2211.06530), Sec. 2; Choquette-Choo et al.
    (arXiv:2306.08153), Sec. 4.
    """
    kind = participation.kind
    b = participation.separation
    cap = {
        ParticipationKind.SINGLE: 1,
        ParticipationKind.MIN_SEPARATION: int(participation.max_participations or 1),
        ParticipationKind.CYCLIC_POISSON: None,
    }[kind]
    cyclic = kind is ParticipationKind.CYCLIC_POISSON
    rounds: dict[int, list[int]] = {}

    def fail(client: int, t: int, reason: str) -> PatternViolation:
        return PatternViolation(client, (*rounds.get(client, []), t), reason)

    for t, cohort in enumerate(history, start=1):
        ids = np.asarray(cohort, dtype=np.int64).ravel()
        uniq, counts = np.unique(ids, return_counts=True)
        if (counts > 1).any():
            client = int(uniq[counts > 1][0])
            raise fail(client, t, f"listed {int(counts[counts > 1][0])} times in round {t}")
        for client in (int(c) for c in uniq):
            past = rounds.setdefault(client, [])
            if cyclic and groups is not None and (t - 1) % b != int(groups[client]):
                raise fail(client, t, f"round {t} is not of its group {int(groups[client])}")
            if past:
                gap = t - past[-1]
                if gap < b:
                    raise fail(client, t, f"rounds {past[-1]} and {t} are < {b} apart")
                if cyclic and gap % b:
                    raise fail(
                        client,
                        t,
                        f"rounds {past[-1]} and {t} are not a multiple of {b} "
                        "apart (two cyclic groups)",
                    )
            if cap is not None and len(past) >= cap:
                raise fail(client, t, f"more than {cap} participations")
            past.append(t)
