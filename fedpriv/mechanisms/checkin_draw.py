"""The random check-in draw: the protocols, a client's window ``R_j``, its own RNG and its
``(R_j, p0)`` draw.

Core module shared by the client algorithm (which draws), the server strategy (which only
sees the answers) and the accounting (whose analyses are named by :class:`CheckinVariant`).
The server never samples clients: each client, with its own randomness, participates with
probability ``checkin_probability`` ``p0`` and picks a slot uniformly from its window
``R_j``, or answers :data:`fedpriv.common.wire.ABSTAIN`.

References
----------
Balle, Bell, Gascon, Kairouz, Thakurta, "Privacy Amplification via Random Check-Ins"
(arXiv:2007.06605), Definition of an ``(R_j, p_j)`` check-in (Section 3), Algorithm 1 and the
sliding window of Section 4.2.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np

from fedpriv.common.errors import ConfigError, check
from fedpriv.common.validate import parse_enum
from fedpriv.common.wire import ABSTAIN

__all__ = ["CheckinVariant", "checkin_window", "checkin_rng", "draw_checkin"]


class CheckinVariant(StrEnum):
    """The check-in protocols (and the analyses that account them).

    ``fixed`` (Algorithm 1, Theorem 3.2), ``averaged`` (Algorithm 2, Theorem 4.1),
    ``sliding-window`` (Section 4.2, Theorem 4.3), ``poisson`` (server-side Poisson sampling
    of clients, the baseline: ``fedpriv.accounting.checkin.events.PoissonLocalEvent``) and
    ``shuffle`` (Theorem 5.1 and, for pure ``eps0``, the FMT21 numerical bound: shuffling of
    ``n`` local reports; an analysis of ``fedpriv-account`` only, no run).
    A closed set: each member names the protocol a run executes and the analysis that
    accounts it; any other value would run something no analysis covers.
    """

    FIXED = "fixed"
    AVERAGED = "averaged"
    SLIDING_WINDOW = "sliding-window"
    POISSON = "poisson"
    SHUFFLE = "shuffle"


_CHECKIN_STREAM = 0x636B  # domain separation of the check-in RNG from the noise RNG


def checkin_window(variant: str, num_slots: int, partition_id: int) -> tuple[int, int]:
    """Client ``j``'s window ``R_j`` as an inclusive 1-based slot range ``(first, last)``.

    ``fixed`` / ``averaged``: ``[1, m]`` (``R_j = [m]``); ``sliding-window``: client ``j =
    partition_id + 1`` wakes at time ``j`` and its window is ``{j, ..., j + m - 1}`` (Section
    4.2). ``poisson`` and ``shuffle`` have no check-in.

    Parameters
    ----------
    variant : CheckinVariant or str
        The protocol.
    num_slots : int
        ``m``: slots of a pass, or the sliding window's length.
    partition_id : int
        The client's index ``j - 1 >= 0``.

    Returns
    -------
    tuple of int
        ``(first, last)`` slot numbers, inclusive.

    Raises
    ------
    ConfigError
        For a variant without check-ins or a negative ``partition_id``.
    """
    check(partition_id >= 0, "partition_id", partition_id, "must be >= 0")
    v = parse_enum(CheckinVariant, "client.variant", variant)
    if v in (CheckinVariant.FIXED, CheckinVariant.AVERAGED):
        return 1, int(num_slots)
    if v is CheckinVariant.SLIDING_WINDOW:
        j = int(partition_id) + 1
        return j, j + int(num_slots) - 1
    raise ConfigError(
        "client.variant",
        str(variant),
        "has no check-in window (one of: fixed, averaged, sliding-window)",
    )


def checkin_rng(
    seed: int, server_round: int, partition_id: int, secure_mode: bool
) -> np.random.Generator:
    """The client's own check-in RNG: seeded from ``(seed, pass, partition_id)`` or OS entropy.

    ``secure_mode`` draws from OS entropy (nothing in the config can reproduce the draw).
    """
    if secure_mode:
        return np.random.default_rng()
    return np.random.default_rng([int(seed), int(server_round), int(partition_id), _CHECKIN_STREAM])


def draw_checkin(
    rng: np.random.Generator, checkin_probability: float, window: tuple[int, int]
) -> int:
    """An ``(R_j, p0)`` check-in: with probability ``p0`` a slot uniform on ``window``.

    Returns
    -------
    int
        The slot, or :data:`fedpriv.common.wire.ABSTAIN` (``-1``) with probability ``1 - p0``.
    """
    if rng.random() >= checkin_probability:
        return ABSTAIN
    first, last = window
    return int(rng.integers(first, last + 1))
