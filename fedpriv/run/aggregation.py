"""Aggregators: the only code that touches individual client replies (core interface).

A strategy hands an aggregator the train messages of a round and gets back only the SUM of
the clients' updates (third paper, §3: "a trusted aggregator reveals only sum_i Delta_i").
The ideal aggregator does this in-process; a SecAgg+ aggregator does it through Flower's
protocol. Either way the strategy never sees a single client's update.

The interface (:class:`Aggregator`, :class:`AggregateResult`, :class:`RoundFailed`) lives in
the core so the runner never imports ``strategies/``.
An aggregator DECLARES its capabilities as class attributes (e.g.
:attr:`Aggregator.requires_integer_updates`); the runner checks them, never its ``_target_``.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

import numpy as np
from flwr.app import Message
from flwr.serverapp import Grid
from hydra.utils import get_class

from fedpriv.common.errors import ConfigError, check
from fedpriv.common.wire import METRICS_KEY, UPDATE_KEY
from fedpriv.run.engine import PartialSum, clients_in, reply_part


class RoundFailure(StrEnum):
    """What a run does with a client that raises, times out or sends non-finite values
    (top-level ``round_failure``)."""

    DROP = "drop"  # a dropout: the round is accounted with the survivors' noise
    STOP = "stop"  # the run ends, status failed, with the client's error


class RoundFailed(RuntimeError):
    """A round could not be aggregated (missing or failed replies beyond tolerance).

    The strategy keeps the model unchanged and records no privacy release for the round.
    ``num_ok`` is how many clients did reply successfully (0 suggests a bug, not dropouts).
    """

    def __init__(self, message: str, num_ok: int = 0, errors: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.num_ok = num_ok
        self.errors = list(errors)  # one line per client that raised (its id and error)


def error_reason(reply: Message) -> str:
    """The last meaningful line of a client's error (Ray wraps it in a long traceback)."""
    text = str(reply.error.reason).replace("\\n", "\n")
    match = re.findall(r"Message: (.*?)(?:\\n|\n|'>|$)", text)
    return (match[-1] if match else text.strip().splitlines()[-1])[:300]


@dataclass
class AggregateResult:
    """What an aggregator reveals for one round.

    Attributes
    ----------
    total : dict[str, np.ndarray]
        Sum over the contributing clients of their update arrays (float64 for real-valued
        updates, int64 for integer ones), keyed like the clients' ArrayRecord.
    num_clients : int
        How many clients contributed to the sum (their noise is in it).
    metrics : dict[str, float]
        Sums of the contributors' reported metrics (diagnostics only; never weights).
    dropped : dict[str, int]
        Clients left out of the sum by the aggregator, by reason (e.g.
        ``{"non-finite update": 1}``); the round is then accounted with the survivors' noise.
    errors : list[str]
        One line per client that raised (``"client 3: ValueError: ..."``).
    nodes : set[str]
        The Ray nodes the replies came from (engine diagnostics; empty where not told).
    """

    total: dict[str, np.ndarray]
    num_clients: int
    metrics: dict[str, float] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    nodes: set[str] = field(default_factory=set)


class Aggregator(ABC):
    """Sends a round's train messages and returns only the sum of the replies' updates.

    Capabilities (class attributes a subclass sets):

    - ``requires_integer_updates``: the clients must send integer residues in
      ``[0, 2**bits)`` (the instance then has a ``bits`` attribute), e.g. SecAgg+;
    - ``uses_secagg_mods``: the clients' ``ClientApp`` must register
      :data:`fedpriv.run.secagg_codec.SECAGG_MODS`;
    - ``sums_on_workers``: it needs only each worker's sum of its clients' finite rows, so
      worker messages ask for it (:func:`fedpriv.run.engine.worker_messages`, ``summed``).
    """

    requires_integer_updates: ClassVar[bool] = False
    uses_secagg_mods: ClassVar[bool] = False
    sums_on_workers: ClassVar[bool] = False
    #: The modular width of the integer sum (aggregators that require integer updates).
    bits: int | None = None

    @abstractmethod
    def sum_updates(
        self, grid: Grid, messages: Sequence[Message], *, server_round: int, timeout: float
    ) -> AggregateResult:
        """Send ``messages`` (one per client), wait at most ``timeout`` seconds, return the sum.

        Raises
        ------
        RoundFailed
            If fewer replies than required arrive or a client reports an error.
        """


NON_FINITE = "non-finite update"
CLIENT_ERROR = "client error"


def is_finite_reply(reply: Message) -> bool:
    """Whether every value of the reply's ``update`` arrays is finite (integers always are)."""
    record = reply.content.array_records[UPDATE_KEY]
    return all(
        np.issubdtype(arr.dtype, np.integer) or bool(np.isfinite(arr).all())
        for arr in record.to_numpy_ndarrays(keep_input=True)
    )


def sum_replies(replies: Sequence[Message]) -> AggregateResult:
    """Sum the ``update`` arrays and ``metrics`` of ``replies`` (order-independent result)."""
    total: dict[str, np.ndarray] = {}
    metrics: dict[str, float] = {}
    for reply in replies:
        arrays = reply.content.array_records[UPDATE_KEY].to_numpy_ndarrays(keep_input=True)
        keys = list(reply.content.array_records[UPDATE_KEY].keys())
        for key, arr in zip(keys, arrays, strict=True):
            acc = np.int64 if np.issubdtype(arr.dtype, np.integer) else np.float64
            total[key] = total.get(key, 0) + arr.astype(acc)
        if METRICS_KEY in reply.content.metric_records:
            for key, val in reply.content.metric_records[METRICS_KEY].items():
                if isinstance(val, (int, float)):
                    metrics[key] = metrics.get(key, 0.0) + float(val)
    return AggregateResult(total=total, num_clients=len(replies), metrics=metrics)


@dataclass
class IdealAggregator(Aggregator):
    """In-process trusted aggregator: all replies must arrive; it reveals only their sum.

    Parameters
    ----------
    min_replies : int | None
        Minimum number of successful replies with finite updates; ``None`` means all clients
        must reply (non-finite updates among them are then dropped, not failed).

    Notes
    -----
    A reply whose update holds NaN or ±inf is NEVER summed: that client counts as dropped
    for the round (``AggregateResult.dropped["non-finite update"]``), and the run accounts
    the round with the survivors' noise (the algorithm's ``degraded_round_events``).
    """

    min_replies: int | None = None
    sums_on_workers: ClassVar[bool] = True

    def sum_updates(
        self, grid: Grid, messages: Sequence[Message], *, server_round: int, timeout: float
    ) -> AggregateResult:
        replies = list(grid.send_and_receive(list(messages), timeout=timeout))
        expected = clients_in(messages)
        good = [r for r in replies if not r.has_error() and UPDATE_KEY in r.content.array_records]
        parts = [reply_part(r) for r in good]
        errors = [error_reason(r) for r in replies if r.has_error()]
        errors += [e for part in parts for e in part.errors.values()]
        replied = sum(len(part.ids) for part in parts)
        need = expected if self.min_replies is None else self.min_replies
        if replied < need:
            why = (
                f"errors: {[e.splitlines()[0] for e in errors[:2]]}"
                if errors
                else f"the others sent nothing within round_timeout={timeout:g} s"
            )
            raise RoundFailed(
                f"round {server_round}: {replied}/{expected} clients replied (need {need}); {why}",
                num_ok=replied,
                errors=errors,
            )
        result = sum_parts(parts)
        result.errors = errors
        if errors:
            result.dropped[CLIENT_ERROR] = len(errors)
        if result.num_clients == 0:
            raise RoundFailed(
                f"round {server_round}: every update of the {replied} replies is non-finite",
                num_ok=0,
                errors=errors,
            )
        if self.min_replies is not None and result.num_clients < self.min_replies:
            raise RoundFailed(
                f"round {server_round}: {result.num_clients}/{expected} finite updates "
                f"(need {self.min_replies})",
                num_ok=result.num_clients,
                errors=errors,
            )
        return result


def sum_parts(parts: Sequence[PartialSum]) -> AggregateResult:
    """Add the replies' parts (:func:`fedpriv.run.engine.reply_part`) in the order of their
    first client id (reply order for node-per-client parts).

    Each part sums its own clients in the order they finished (client-id order, except clients
    retrained one by one after a failed vmap chunk), so the result depends on how the cohort
    was split over workers only through float64 rounding (the grouping of the additions); the
    same split gives the same bits. Rows holding NaN or +-inf are left out and counted in
    ``dropped[NON_FINITE]``.
    """
    order = sorted(range(len(parts)), key=lambda p: (min(parts[p].ids, default=1 << 62), p))
    total: dict[str, np.ndarray] = {}
    metrics: dict[str, float] = {}
    for p in order:
        for key, arr in parts[p].total.items():
            total[key] = total[key] + arr if key in total else arr.copy()
        for key, val in parts[p].metrics.items():
            metrics[key] = metrics.get(key, 0.0) + val
    result = AggregateResult(
        total=total, num_clients=sum(p.num_clients for p in parts), metrics=metrics
    )
    result.nodes = {p.node for p in parts if p.node}
    non_finite = sum(len(p.non_finite) for p in parts)
    if non_finite:
        result.dropped[NON_FINITE] = non_finite
    return result


def aggregator_class(node: Mapping[str, Any] | None) -> type[Aggregator]:
    """The :class:`Aggregator` class an ``aggregator`` config node's ``_target_`` names
    (default: ideal).

    Raises
    ------
    ConfigError
        If ``_target_`` cannot be imported or is not an :class:`Aggregator`.
    """
    target = str((node or {}).get("_target_") or "fedpriv.run.aggregation.IdealAggregator")
    allowed = "must name an importable fedpriv.run.aggregation.Aggregator class"
    try:
        cls = get_class(target)
    except Exception:  # Hydra raises ImportError/ValueError variants
        raise ConfigError("aggregator._target_", target, allowed) from None
    check(
        isinstance(cls, type) and issubclass(cls, Aggregator),
        "aggregator._target_",
        target,
        allowed,
    )
    return cls
