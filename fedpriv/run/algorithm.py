"""The interface of a client algorithm: the local training a Flower client runs.

A client algorithm is a frozen dataclass built by the run from the ``client`` config group
(``_target_``) with the run's privacy spec (``privacy``, of the family the algorithm declares in
:attr:`ClientAlgorithm.spec_type`), then bound to the run with :meth:`ClientAlgorithm.for_run`.
It trains locally and holds the BOUND spec, which states the events of its releases and the
noise it draws: the server's accountant composes exactly what the clients did.

Capabilities are declared class attributes, never probed: ``integer_updates`` (SecAgg+ needs
integers), ``hardened_noise``, ``privacy_unit``, ``checks_in`` (the client answers the check-in
server's query messages and needs ``strategy=checkin``), ``adaptive_clipping``.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar, Self

import numpy as np
import torch
from flwr.app import Context, Message
from torch import nn

from fedpriv.accounting.core.privacy_spec import PrivacySpec
from fedpriv.common.errors import check
from fedpriv.data.client_data import ClientData

if TYPE_CHECKING:
    from fedpriv.run.plan import RunPlan

#: A whole-message handler of a client algorithm: ``(plan, message, context) -> reply``.
MessageHandler = Callable[["RunPlan", Message, Context], Message]


class PrivacyUnit(StrEnum):
    """What one neighbouring dataset differs by: one training record, or a whole client."""

    RECORD = "record"
    CLIENT = "client"


class MessageKind(StrEnum):
    """The Flower messages a client algorithm may handle whole (:meth:`message_handler`)."""

    TRAIN = "train"
    QUERY = "query"


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


#: What :meth:`ClientAlgorithm.train` returns: the update (parameter name -> tensor) and
#: diagnostic metrics (never weights).
TrainResult = tuple[dict[str, torch.Tensor], dict[str, float]]


class ClientAlgorithm(ABC):
    """Local training of one client for one server round.

    Subclasses are frozen dataclasses with a field ``privacy`` of their :attr:`spec_type`.

    Notes
    -----
    Train metrics: besides diagnostics, ``train`` returns ``"noise_draws"``, how many noise
    vectors this client drew in the round (e.g. one per local step). The aggregator sums it
    over the clients; the contract test checks it equals the count of one client's events.
    """

    #: The privacy spec family the algorithm runs (the class of its ``privacy`` field).
    spec_type: ClassVar[type[PrivacySpec]] = PrivacySpec  # type: ignore[type-abstract]
    #: True if ``train`` returns integer residues (required by the SecAgg+ aggregator).
    integer_updates: ClassVar[bool] = False
    #: True if the noise is hardened against floating-point attacks (Mironov 2012), e.g.
    #: integer Skellam noise; float Gaussian noise is not.
    hardened_noise: ClassVar[bool] = False
    #: The ``_target_`` of the algorithm that runs in its place with ``privacy.secure_mode=true``
    #: when its own noise is float (not :attr:`hardened_noise`): the same training on a lattice
    #: with integer noise, accounted by its own spec (:func:`fedpriv.run.prepare.lattice_twin`).
    lattice_twin: ClassVar[str | None] = None
    #: The privacy unit.
    privacy_unit: ClassVar[PrivacyUnit] = PrivacyUnit.RECORD
    #: True for random check-in clients: they answer query messages (``strategy=checkin``).
    checks_in: ClassVar[bool] = False
    #: Fields :meth:`for_run` binds from the run (not config keys).
    bound_fields: ClassVar[tuple[str, ...]] = ()
    #: Whether Hydra instantiates nested ``_target_`` nodes of the client's config (its
    #: ``_recursive_``); False: they reach the constructor as data (e.g. an optimizer the
    #: algorithm builds itself, once per group).
    recursive_config: ClassVar[bool] = True

    privacy: PrivacySpec

    @property
    def update_bits(self) -> int | None:
        """The modular width of integer updates (``integer_updates``); ``None``: floats."""
        return None

    @property
    def adaptive_clipping(self) -> bool:
        """True if the clip norm changes from round to round (adaptive clipping: the server
        releases each next clip norm in ``round_config``); default False."""
        return False

    @property
    def normalizer(self) -> float:
        """The PUBLIC constant dividing every released quantity (the same for every client).

        Never computed from a client's own data size, so the accounted σ holds for every
        record. Recorded as ``"normalizer"`` in ``results.json``.
        """
        raise NotImplementedError(f"{type(self).__name__} does not state its public normalizer")

    @abstractmethod
    def train(self, model: nn.Module, data: ClientData, ctx: TrainContext) -> TrainResult:
        """Train from the global ``model`` (modified in place) and return ``(update, metrics)``.

        ``update`` maps parameter names to tensors (what the aggregator sums); ``metrics``
        are diagnostics only and never weight the aggregation.
        """

    def train_cohort(
        self, model: nn.Module, datas: Sequence[ClientData], ctxs: Sequence[TrainContext]
    ) -> tuple[dict[str, torch.Tensor], list[dict[str, float]]]:
        """:meth:`train` for clients that all start from ``model``, vectorized: the updates
        stacked ``(k, *param.shape)`` and each client's metrics. Optional: an algorithm that
        defines it is run this way on dense models (``vmap_clients``).

        Raises
        ------
        NotImplementedError
            If the algorithm trains one client at a time (default).
        """
        raise NotImplementedError(f"{type(self).__name__} trains one client at a time")

    def trains_cohorts(self) -> bool:
        """Whether :meth:`train_cohort` is the vectorized form of THIS algorithm's ``train``:
        the class that defines ``train_cohort`` also defines the ``train`` in use (a subclass
        that overrides ``train``, e.g. to post-process the update, trains one by one)."""
        cls = type(self)
        owner = next(c for c in cls.__mro__ if "train_cohort" in vars(c))
        return owner is not ClientAlgorithm and vars(owner).get("train") is _train_of(cls)

    def for_run(self, plan: RunPlan) -> Self:
        """A copy bound to the run (its privacy spec bound to the run's facts: local steps,
        nominal cohort, normalizer, ...). The server and every worker call it on the same
        plan, so both sides hold the same algorithm. Default: ``self``."""
        return self

    def calibrated(self, num_rounds: int) -> Self:
        """A copy whose spec is calibrated to its ``target_epsilon`` after ``num_rounds``."""
        target = self.privacy.target_epsilon
        if target is None:
            return self
        spec = self.privacy.calibrated(target, num_rounds)
        return dataclasses.replace(self, privacy=spec)  # type: ignore[type-var]

    def decode_sum(
        self, total: dict[str, Any], shapes: dict[str, tuple[int, ...]], server_round: int
    ) -> dict[str, Any]:
        """The real-valued SUM of the clients' deltas from the aggregated ``total`` (default: as
        is)."""
        return total

    def sum_figures(self, total: dict[str, Any], server_round: int) -> dict[str, float]:
        """Figures of the aggregated ``total`` before decoding, for the round's row (e.g. the
        coordinates of an integer sum that wrapped). Default: none."""
        return {}

    def initial_round_config(self) -> dict[str, float]:
        """Public parameters the server sends with round 1 (``TrainContext.round_config``);
        :meth:`release` returns the next round's. Default: none."""
        return {}

    def release(
        self, total: dict[str, Any], server_round: int, round_config: Mapping[str, float]
    ) -> tuple[dict[str, Any], dict[str, float], dict[str, float]]:
        """The server's part of a round, on the decoded SUM: ``(sum to apply, figures for the
        round's row, next round_config)``. An algorithm whose noise the trusted aggregator
        adds draws it here, with the parameters of its spec. Default: the sum as is, no
        figures, the same config."""
        return total, {}, dict(round_config)

    def message_handler(self, kind: MessageKind) -> MessageHandler | None:
        """A handler taking over whole ``kind`` messages (check-in clients: the query and the
        slot messages); ``None`` (default): the run's worker handler trains the clients a
        message names."""
        return None

    def privacy_summary(self) -> dict[str, Any]:
        """The spec's summary with the public ``normalizer`` (``results.json``)."""
        try:
            normalizer: float | None = float(self.normalizer)
        except NotImplementedError:
            normalizer = None
        return {**self.privacy.summary(), "normalizer": normalizer}


def check_spec(algorithm: ClientAlgorithm, family: type[PrivacySpec]) -> None:
    """Refuse a privacy spec of another family than the one ``algorithm`` runs.

    Raises
    ------
    ConfigError
        ``privacy='checkin' does not fit LocalDPSGD: use privacy=dpsgd``.
    """
    spec = algorithm.privacy
    check(
        isinstance(spec, family) and spec.family == family.family,  # a subclass of another family
        "privacy",
        spec.family if isinstance(spec, PrivacySpec) else type(spec).__name__,
        f"does not fit {type(algorithm).__name__}: use privacy={family.family} "
        "(or leave privacy unset: the client option selects its family)",
    )


def _train_of(cls: type) -> object:
    """The ``train`` function ``cls`` uses (the first class of its MRO that defines one)."""
    return next(vars(c)["train"] for c in cls.__mro__ if "train" in vars(c))
