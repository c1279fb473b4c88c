"""The interface of a client algorithm (the local training a Flower client runs).

It lives in the core so that :mod:`fedpriv.run.setup` and the runner never import ``clients/``;
``clients.base`` re-exports it.

A client algorithm is a frozen dataclass built by Hydra from the ``client`` config group
(``_target_``), with the run's ``privacy`` group and ``num_clients`` passed in. It trains
locally and states the privacy events its releases produce, so the server's accountant
composes exactly what the clients did.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class ClientData:
    """A client's local data: ``x`` of shape ``(n, *input_shape)`` float32, ``y`` ``(n,)`` int64."""

    x: torch.Tensor
    y: torch.Tensor
    partition_id: int

    def __len__(self) -> int:
        return int(self.x.shape[0])


@dataclass(frozen=True)
class TrainContext:
    """Per-call context: the server round, the client's randomness, its device, and the
    round's public parameters from the server (``round_config``, e.g. an adaptive clip norm:
    :meth:`ClientAlgorithm.initial_round_config`)."""

    server_round: int
    rng: np.random.Generator
    generator: torch.Generator
    device: torch.device
    round_config: Mapping[str, float] = field(default_factory=dict)


class ClientAlgorithm(ABC):
    """Local training of one client for one server round.

    Notes
    -----
    Train metrics: besides diagnostics, ``train`` returns ``"noise_draws"``, how many noise
    vectors this client drew in the round (e.g. one per local step). The aggregator sums it
    over the clients; the contract test checks it equals the count of one client's events.
    """

    #: True if ``train`` returns integer residues (required by the SecAgg+ aggregator).
    integer_updates: ClassVar[bool] = False
    #: True only where group ε is computed (batch clipping); others refuse privacy.group_sizes.
    supports_group_privacy: ClassVar[bool] = False
    #: True if the noise is hardened against floating-point attacks (Mironov 2012), e.g.
    #: integer Skellam noise; float Gaussian noise is not.
    hardened_noise: ClassVar[bool] = False
    #: The privacy unit: ``"record"`` (one training record) or ``"client"`` (a whole client).
    privacy_unit: ClassVar[str] = "record"

    @property
    def normalizer(self) -> float:
        """The PUBLIC constant dividing every released quantity (the same for every client).

        Never computed from a client's own data size, so the accounted σ holds for every
        record. Recorded as ``"normalizer"`` in ``privacy_summary()`` and ``results.json``.

        Raises
        ------
        NotImplementedError
            If the algorithm does not state it (every client algorithm must).
        """
        raise NotImplementedError(f"{type(self).__name__} does not state its public normalizer")

    @abstractmethod
    def train(
        self, model: nn.Module, data: ClientData, ctx: TrainContext
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """Train from the global ``model`` (modified in place) and return ``(update, metrics)``.

        ``update`` maps parameter names to tensors (what the aggregator sums); ``metrics``
        are diagnostics only and never weight the aggregation.
        """

    @abstractmethod
    def round_events(self) -> list[tuple[Any, int]]:
        """Privacy events of one round's aggregated release, as ``[(event, count), ...]``."""

    def degraded_round_events(self, contributors: int) -> list[tuple[Any, int]]:
        """Events of a round whose sum holds only ``contributors`` of the clients (dropouts).

        Raises ``NotImplementedError`` when the algorithm cannot account for it; the run then
        stops rather than under-report ε.
        """
        raise NotImplementedError(
            f"{type(self).__name__} cannot account a round with {contributors} clients"
        )

    def for_run(self, cfg: dict[str, Any]) -> ClientAlgorithm:
        """A copy bound to the run's resolved ``cfg`` (data sizes, model dimension, seed).

        Called by :func:`fedpriv.run.setup.build_algorithm` on the server and in every client, so
        both sides hold the same algorithm. Default: ``self``.
        """
        return self

    def decode_sum(
        self, total: dict[str, Any], shapes: dict[str, tuple[int, ...]], server_round: int
    ) -> dict[str, Any]:
        """The real-valued SUM of the clients' deltas from the aggregated ``total`` (default: as
        is)."""
        return total

    def initial_round_config(self) -> dict[str, float]:
        """Public parameters the server sends with round 1 (``TrainContext.round_config``);
        :meth:`release` returns the next round's. Default: none."""
        return {}

    def release(
        self, total: dict[str, Any], server_round: int, round_config: Mapping[str, float]
    ) -> tuple[dict[str, Any], dict[str, float], dict[str, float]]:
        """The server's part of a round, on the decoded SUM: ``(sum to apply, figures for the
        round's row, next round_config)``. An algorithm whose noise the trusted aggregator
        adds draws it here (so its events and its noise come from one object). Default: the
        sum as is, no figures, the same config."""
        return total, {}, dict(round_config)

    def accounting_epoch(self, server_round: int) -> int | None:
        """The epoch whose events cover ``server_round`` (recorded once, at its first released
        round: e.g. random allocation); ``None`` (default): every round is its own event."""
        return None

    def local_events(self) -> list[tuple[Any, int]]:
        """Privacy events of one round for a single client's own release (its LDP); default none."""
        return []

    def privacy_report(self, rounds: int, target_delta: float) -> dict[str, float]:
        """Extra per-round privacy figures to print and save (e.g. ε for groups of g samples).

        ``rounds`` is the number of released server rounds so far. Default: none.
        """
        return {}

    def privacy_summary(self) -> dict[str, Any]:
        """Mechanism parameters to save in ``results.json``'s ``privacy`` block (default none)."""
        return {}

    def calibrated(
        self, target_epsilon: float, target_delta: float, num_rounds: int
    ) -> ClientAlgorithm:
        """A copy whose noise meets ``target_epsilon`` after ``num_rounds`` rounds."""
        raise NotImplementedError(
            f"{type(self).__name__} does not support target_epsilon calibration"
        )
