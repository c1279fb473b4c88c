"""Random check-ins, client side: the check-in decision and one update per check-in.

"Privacy Amplification via Random Check-Ins" (Balle, Bell, Gascon, Kairouz, Thakurta,
arXiv:2007.06605). The server never samples clients: it sends a check-in query (a Flower
``query`` message) to every WORKER node naming the virtual clients it hosts
(:mod:`fedpriv.run.engine`), and each client, with ITS OWN randomness, participates with
probability ``checkin_probability`` ``p0`` and picks a slot uniformly from its window ``R_j``
(:func:`fedpriv.mechanisms.checkin_draw.draw_checkin`). The worker remembers its clients'
slots in its Flower ``Context.state`` and answers, per client, with the slot or ``ABSTAIN``.
When the server later asks a client for the update of that slot (a ``train`` message naming
``(client id, slot)`` pairs), the client computes, at the model it receives, the gradient of
its mean loss over its own data and:

* :class:`CheckinClient` (``client=checkin``, ``privacy=checkin``) clips it to
  ``privacy.clipping_norm`` L and applies the local randomizer of its spec
  (:attr:`fedpriv.accounting.checkin.spec.CheckinSpec.local_randomizer`): ``gaussian`` (l2
  clip, analytic Gaussian calibrated to (``local_epsilon``, ``local_delta``) at l2
  sensitivity ``2L``) or ``laplace`` (l1 clip, ``Laplace(2L / local_epsilon)``, pure
  ``local_epsilon``-DP). The report is sent as it is: nothing divides it (``normalizer = 1``),
  in particular not the client's data size; the mean loss only averages inside the gradient,
  before clipping, so the clipped report lies in the ball of radius L whatever the data.
* :class:`CheckinGaussianClient` (``client=checkin_gaussian``, ``privacy=checkin_gaussian``)
  sends it L2-clipped, without local noise; the trusted aggregator adds the Gaussian to each
  slot's sum (:class:`fedpriv.accounting.checkin.gaussian.CheckinGaussianSpec`).

Each client holds its run's spec, bound to the client's protocol (variant, slots, window,
randomizer) and the run (clients, passes) by :meth:`~fedpriv.run.algorithm.ClientAlgorithm.
for_run`; the same spec states the events the server composes (``fedpriv-account checkin``
builds the same spec). A client is one virtual client of a worker; its privacy unit is all its
rows.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, cast

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from torch import nn

from fedpriv.accounting.checkin.gaussian import CheckinGaussianSpec, CheckinNoise
from fedpriv.accounting.checkin.spec import RUN_VARIANTS, CheckinSpec
from fedpriv.accounting.core.privacy_spec import PrivacySpec
from fedpriv.accounting.secure_mode import lattice_bound
from fedpriv.common.errors import check
from fedpriv.common.validate import parse_enum
from fedpriv.common.wire import (
    ABSTAIN,
    CHECKIN_KEY,
    CLIENTS_KEY,
    CONFIG_KEY,
    METRICS_KEY,
    MODEL_KEY,
    UPDATE_KEY,
    record_int,
)
from fedpriv.data.client_data import ClientData
from fedpriv.mechanisms.checkin_draw import (
    CheckinVariant,
    checkin_rng,
    checkin_window,
    draw_checkin,
)
from fedpriv.mechanisms.client_sampling import ClientSampling
from fedpriv.mechanisms.clipping import clip_tensors
from fedpriv.mechanisms.noise import make_generator
from fedpriv.mechanisms.randomizers import RandomizerKind
from fedpriv.run.algorithm import (
    ClientAlgorithm,
    MessageHandler,
    MessageKind,
    PrivacyUnit,
    TrainContext,
    check_spec,
)
from fedpriv.run.client_app import client_data, worker_model
from fedpriv.run.engine import named_clients, row_blocks, stacked_reply
from fedpriv.run.plan import RunPlan
from fedpriv.run.setup import build_model_for, resolve_device

__all__ = [
    "CheckinParticipant",
    "CheckinClient",
    "CheckinGaussianClient",
    "mean_cross_entropy",
    "slot_report",
    "slot_update",
]


def mean_cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the client's data (its empirical loss)."""
    return nn.functional.cross_entropy(out, y)


def mean_loss_gradient(
    model: nn.Module, data: ClientData, device: torch.device
) -> tuple[dict[str, torch.Tensor], float]:
    """The gradient of the client's mean loss at ``model`` (parameter name -> tensor) and the
    loss."""
    params = dict(model.named_parameters())
    x, y = data.x.to(device), data.y.to(device)
    loss = mean_cross_entropy(model(x), y)
    grads = torch.autograd.grad(loss, list(params.values()))
    return {k: g.detach() for k, g in zip(params, grads, strict=True)}, float(loss.detach())


def check_cohort(plan: RunPlan, client: str) -> None:
    """Refuse a server cohort: check-in clients decide themselves whether to take part.

    Raises
    ------
    ConfigError
        For ``client_sampling`` other than ``all`` (a server cohort would be another
        protocol, which the check-in analyses do not cover).
    """
    sampling = plan.cohort.client_sampling
    check(
        sampling is ClientSampling.ALL,
        "client_sampling",
        sampling.value,
        f"is not supported with client={client} (each client decides itself whether to "
        "check in, privacy.checkin_probability): use client_sampling=all",
    )


class CheckinParticipant(ClientAlgorithm):
    """What every check-in client does besides its update: answer the check-in query and the
    slot messages of the clients a worker hosts (:meth:`message_handler`).

    A subclass is a frozen dataclass with ``variant`` and ``num_slots`` fields, a spec with
    ``checkin_probability``, and :meth:`bound_spec` (its spec once bound to the run).
    """

    checks_in: ClassVar[bool] = True
    privacy_unit: ClassVar[PrivacyUnit] = PrivacyUnit.CLIENT

    variant: CheckinVariant
    num_slots: int

    @abstractmethod
    def bound_spec(self) -> CheckinSpec | CheckinGaussianSpec:
        """The spec bound to the run (its client facts and passes).

        Raises
        ------
        ConfigError
            If the algorithm was not bound with :meth:`for_run`.
        """

    def _check_bound(self, num_rounds: int | None) -> None:
        check(
            num_rounds is not None,
            "client",
            type(self).__name__,
            "is not bound to a run yet: build it with build_algorithm(plan) or for_run(plan)",
        )

    def message_handler(self, kind: MessageKind) -> MessageHandler | None:
        """The check-in query (``query``) and the slot updates (``train``)."""
        if kind is MessageKind.QUERY:
            return self.query_handler
        if kind is MessageKind.TRAIN:
            return self.slot_handler
        return None

    def query_handler(self, plan: RunPlan, msg: Message, context: Context) -> Message:
        """A worker answers a check-in query for every virtual client the query names.

        The query's ConfigRecord ``checkin`` carries ``server_round`` (the pass), ``variant``
        and ``num_slots`` (they must match this client's protocol); its ``config`` record names
        the worker's clients (``clients``, :func:`fedpriv.run.engine.named_clients`). Each client
        draws its check-in with ITS OWN RNG, seeded from ``(seed, pass, client id)`` (OS
        entropy in ``secure_mode``; :func:`fedpriv.mechanisms.checkin_draw.checkin_rng`),
        exactly as a node of its own did: the slot (``ABSTAIN`` = -1) and then a random
        ``ticket`` from the same RNG (independent of the data; the server orders a slot's
        check-ins by ticket before its uniform pick). The reply's ``checkin`` record holds the
        lists ``clients``, ``slots`` and ``tickets`` (same order): slot occupancy only, no
        data. The worker remembers the slots in its Flower ``Context.state`` to verify later
        update requests.

        Raises
        ------
        RuntimeError
            If the query is for another protocol or names no clients.
        """
        q = msg.content.config_records[CHECKIN_KEY]
        server_round = record_int(q, "server_round")
        if str(q["variant"]) != self.variant or record_int(q, "num_slots") != int(self.num_slots):
            raise RuntimeError(
                f"check-in query for variant={q['variant']!r} num_slots={q['num_slots']!r} "
                f"does not match this client's protocol ({self.variant}, {self.num_slots})"
            )
        clients = named_clients(msg)
        if clients is None:
            raise RuntimeError("check-in query names no clients (config record 'clients')")
        p0, m = self.bound_spec().checkin_probability, int(self.num_slots)
        slots, tickets = [], []
        for pid in clients:
            rng = checkin_rng(plan.seed, server_round, pid, plan.secure_mode)
            slots.append(draw_checkin(rng, p0, checkin_window(self.variant, m, pid)))
            tickets.append(int(rng.integers(2**62)))
        context.state[CHECKIN_KEY] = ConfigRecord(
            {"server_round": server_round, CLIENTS_KEY: clients, "slots": slots}
        )
        answer = ConfigRecord({CLIENTS_KEY: clients, "slots": slots, "tickets": tickets})
        return Message(content=RecordDict({CHECKIN_KEY: answer}), reply_to=msg)

    def slot_handler(self, plan: RunPlan, msg: Message, context: Context) -> Message:
        """A worker sends the slot updates of the (client id, slot) pairs the message names.

        The message's ``config`` record carries ``server_round``, ``clients`` and ``slots``
        (pair ``i`` is ``(clients[i], slots[i])``; the Poisson baseline may name a client in
        several slots) and the model of the block. Each asked client computes its update
        (:meth:`train`) at that model with its own data and a generator seeded from
        ``(seed, pass, slot, client id)`` (:func:`slot_report`), but only for the (pass, slot)
        it checked into (``poisson``, the server-sampled baseline, has no check-in to
        verify): a request for any other slot is refused for that client. The reply stacks
        the updates (:func:`fedpriv.run.engine.stacked_reply`) with the pairs that succeeded
        in ``clients`` / ``slots``; refused or failed clients are listed in ``failed`` with
        their error line. Each row's metrics include ``compute_s``, the client's own compute
        time (load of the model, gradient, randomizer) in seconds.
        """
        torch.set_num_threads(1)
        conf = msg.content.config_records[CONFIG_KEY]
        server_round = record_int(conf, "server_round")
        clients = named_clients(msg) or []
        slots = [int(s) for s in cast(list[int], conf["slots"])]
        checked = self._checked_in(context, server_round, clients)
        plan_json = plan.to_payload()
        model = worker_model(plan_json)
        start = msg.content.array_records[MODEL_KEY].to_torch_state_dict()
        ok, ok_slots, updates, metrics = [], [], [], []
        failed: dict[int, str] = {}
        for pid, slot, have in zip(clients, slots, checked, strict=True):
            try:
                if self.variant is not CheckinVariant.POISSON and (
                    have is None or have != slot or slot == ABSTAIN
                ):
                    raise RuntimeError(
                        f"asked for the update of (pass, slot)={(server_round, slot)} but "
                        f"checked into {None if have is None else (server_round, have)}"
                    )
                t0 = time.perf_counter()
                model.train()
                model.load_state_dict(start)
                data = client_data(plan_json, pid)
                update, m = slot_report(self, plan, model, data, server_round, slot)
                m["compute_s"] = time.perf_counter() - t0
            except Exception as exc:  # one client's failure is its own, not the worker's
                failed[pid] = f"client {pid}: {type(exc).__name__}: {exc}"[:300]
                continue
            ok.append(pid)
            ok_slots.append(slot)
            updates.append(update)
            metrics.append(m)
        reply = stacked_reply(msg, row_blocks(ok, updates, metrics), failed)
        reply.content.config_records[CONFIG_KEY]["slots"] = ok_slots
        return reply

    @staticmethod
    def _checked_in(context: Context, server_round: int, clients: list[int]) -> list[int | None]:
        """The slot each of ``clients`` checked into this pass (``None``: no check-in here).

        The stored ``clients`` are the worker's share, a contiguous run of ids, so client ``c``
        is looked up at position ``c - first`` (checked), else searched.
        """
        mine = context.state.config_records.get(CHECKIN_KEY)
        if mine is None or record_int(mine, "server_round") != server_round:
            return [None] * len(clients)
        ids = cast(list[int], mine[CLIENTS_KEY])
        have = cast(list[int], mine["slots"])
        first = int(ids[0]) if ids else 0
        out: list[int | None] = []
        where: dict[int, int] | None = None
        for c in clients:
            i = c - first
            if not (0 <= i < len(ids) and int(ids[i]) == c):
                where = where if where is not None else {int(x): k for k, x in enumerate(ids)}
                i = where.get(c, -1)
            out.append(int(have[i]) if i >= 0 else None)
        return out


@dataclass(frozen=True)
class CheckinClient(CheckinParticipant):
    """A random check-in client: one clipped, locally randomized gradient per check-in.

    Parameters
    ----------
    variant : {"fixed", "averaged", "sliding-window", "poisson"}
        The protocol (:class:`~fedpriv.mechanisms.checkin_draw.CheckinVariant`); the server
        strategy follows it.
    num_slots : int
        ``m >= 1``: slots of a pass (``fixed``, ``averaged``, ``poisson``: model steps of a
        pass) or the window length (``sliding-window``, ``m <= num_clients``).
    randomizer : {"gaussian", "laplace"}
        The local randomizer (:class:`~fedpriv.mechanisms.randomizers.LocalRandomizer`).
    window : [first, last] or None
        ``R_j`` for ``fixed`` / ``averaged`` (default ``[1, m]``, the only window Theorems
        3.2 / 4.1 cover); null for the sliding window.
    slot_sample_rate : float or None
        ``poisson`` only: the server's per-slot client sampling rate ``q`` (default
        ``checkin_probability / num_slots``).
    noise : {"local"}
        Local randomizers only (:class:`CheckinGaussianClient` runs ``central_gaussian``).
    privacy : CheckinSpec
        The run's spec (``privacy=checkin``: ``local_epsilon``, ``local_delta``,
        ``clipping_norm``, ``checkin_probability`` p0, ...); :meth:`for_run` binds the fields
        above, the run's clients and passes.

    Raises
    ------
    ConfigError
        One line naming the field (the spec's checks:
        :class:`~fedpriv.accounting.checkin.spec.CheckinSpec`).
    """

    spec_type: ClassVar[type[PrivacySpec]] = CheckinSpec

    variant: CheckinVariant = CheckinVariant.FIXED
    num_slots: int = 100
    randomizer: RandomizerKind = RandomizerKind.LAPLACE
    window: list[int] | None = None
    slot_sample_rate: float | None = None
    noise: CheckinNoise = CheckinNoise.LOCAL
    privacy: CheckinSpec = field(default_factory=CheckinSpec)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        noise = parse_enum(CheckinNoise, "client.noise", self.noise)
        check(
            noise is CheckinNoise.LOCAL,
            "client.noise",
            noise.value,
            "needs client=checkin_gaussian privacy=checkin_gaussian (central Gaussian slot sums, "
            "clients.checkin_clients.CheckinGaussianClient); client=checkin runs local randomizers",
        )
        variant = parse_enum(CheckinVariant, "client.variant", self.variant)
        check(
            variant in RUN_VARIANTS,
            "client.variant",
            variant.value,
            "must be one of: "
            + ", ".join(RUN_VARIANTS)
            + " (shuffle is an analysis of fedpriv-account only)",
        )
        set_(self, "noise", noise)
        set_(self, "variant", variant)
        set_(self, "randomizer", parse_enum(RandomizerKind, "client.randomizer", self.randomizer))
        check_spec(self, CheckinSpec)
        if self.privacy.num_rounds is not None:  # a spec bound to a run: bind this client's
            set_(self, "privacy", self.privacy.bound(**self.protocol()))

    def protocol(self) -> dict[str, Any]:
        """The spec's fields this client binds (its protocol)."""
        return {
            "variant": self.variant,
            "num_slots": self.num_slots,
            "randomizer": self.randomizer,
            "window": None if self.window is None else tuple(self.window),
            "slot_sample_rate": self.slot_sample_rate,
        }

    def for_run(self, plan: RunPlan) -> CheckinClient:
        """Bind the protocol, the run's clients and passes into the spec.

        Raises
        ------
        ConfigError
            For ``client_sampling`` other than ``all``, or a protocol the spec refuses.
        """
        check_cohort(plan, "checkin")
        spec = self.privacy.bound(
            **self.protocol(), num_clients=plan.num_clients, num_rounds=plan.num_rounds
        )
        return replace(self, privacy=spec)

    def bound_spec(self) -> CheckinSpec:
        self._check_bound(self.privacy.num_rounds)
        return self.privacy

    @property
    def normalizer(self) -> float:
        """The public constant dividing a client's report: 1 (see the spec)."""
        return self.privacy.normalizer

    def train(
        self, model: nn.Module, data: ClientData, ctx: TrainContext
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """``A_ldp(theta; d_j)``: the randomized clipped gradient of the mean loss at ``model``."""
        grad, loss = mean_loss_gradient(model, data, ctx.device)
        update = self.bound_spec().local_randomizer.randomize(grad, ctx.generator)
        return {k: v.cpu() for k, v in update.items()}, {
            "examples": float(len(data)),
            "loss": loss,
            "noise_draws": 1.0,  # one randomized report: the local event's count per pass
        }


@dataclass(frozen=True)
class CheckinGaussianClient(CheckinParticipant):
    """Check-ins as participation with CENTRAL Gaussian noise (``client=checkin_gaussian``).

    The fixed window only (``R_j = [m]``): each client checks in with probability ``p0``
    (``privacy.checkin_probability``) into one uniform slot, exactly as :class:`CheckinClient`
    (same query handling, same per-client RNG). When asked, it sends the gradient of its mean
    loss at the slot's model, L2-clipped to ``privacy.clipping_norm`` ``C``, WITHOUT local
    noise: EVERY checked-in client of a slot sends, and the trusted aggregator releases the
    slot's sum plus ``N(0, σ² C² I)`` (``privacy.noise_multiplier`` σ), drawn by
    :meth:`~fedpriv.accounting.checkin.gaussian.CheckinGaussianSpec.slot_noise` of the same
    spec that states the events; empty slots release the noise alone. The server divides by
    the public constant ``max(1, n p0 / m)``.

    Accounting (:mod:`fedpriv.accounting.checkin.gaussian`): the Poisson(``p0``)-subsampled
    random-allocation PLD, add/remove one client; the paper's Theorem 3.2 is reported as not
    applicable (a slot sums several clients). Both routes are in ``results.json``.

    Parameters
    ----------
    variant : {"fixed"}
        Only the fixed window is accounted.
    num_slots : int
        ``m >= 1``: slots (model updates) of a pass.
    window : [1, num_slots] or None
        ``R_j``: only ``[1, m]`` (null) is accounted.
    noise : {"central_gaussian"}
        Every check-in sends; the aggregator adds the noise (``client=checkin`` runs local
        randomizers).
    privacy : CheckinGaussianSpec
        The run's spec (``privacy=checkin_gaussian``); :meth:`for_run` binds ``num_slots``, the
        run's clients and passes.

    Notes
    -----
    ε covers the released slot sums (hence the models). The trusted server also sees who
    checked in where; the per-pass figures it prints (check-ins, per-slot loads, empty
    slots) are its diagnostics, outside the accounted release, like a Poisson run's realized
    cohort size.

    Raises
    ------
    ConfigError
        For a variant other than ``fixed``, a window other than ``[1, m]``, ``client.noise``
        other than ``central_gaussian``, or the spec's refusals (σ missing or not > 0, an
        accountant other than ``pld``).
    """

    spec_type: ClassVar[type[PrivacySpec]] = CheckinGaussianSpec

    variant: CheckinVariant = CheckinVariant.FIXED
    num_slots: int = 100
    window: list[int] | None = None
    noise: CheckinNoise = CheckinNoise.CENTRAL_GAUSSIAN
    privacy: CheckinGaussianSpec = field(default_factory=CheckinGaussianSpec)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        noise = parse_enum(CheckinNoise, "client.noise", self.noise)
        check(
            noise is CheckinNoise.CENTRAL_GAUSSIAN,
            "client.noise",
            noise.value,
            "must be central_gaussian for client=checkin_gaussian (local: client=checkin)",
        )
        variant = parse_enum(CheckinVariant, "client.variant", self.variant)
        check(
            variant is CheckinVariant.FIXED,
            "client.variant",
            variant.value,
            "must be fixed for client=checkin_gaussian (only R_j = [m] is accounted)",
        )
        m = self.num_slots
        check(
            isinstance(m, int) and not isinstance(m, bool) and m >= 1,
            "client.num_slots",
            m,
            "must be an integer >= 1",
        )
        if self.window is not None:
            check(
                list(self.window) == [1, m],
                "client.window",
                list(self.window),
                f"must be null or [1, {m}]: only R_j = [m] is accounted",
            )
        set_(self, "noise", noise)
        set_(self, "variant", variant)
        check_spec(self, CheckinGaussianSpec)
        if self.privacy.secure_mode and not self.privacy.lattice_noise:
            set_(self, "privacy", lattice_bound(self.privacy))
        if self.privacy.num_rounds is not None:  # a spec bound to a run: bind this client's
            set_(self, "privacy", self.privacy.bound(num_slots=m))

    @property
    def hardened_noise(self) -> bool:  # type: ignore[override]
        """``privacy.secure_mode``: the trusted aggregator rounds each slot's sum to a lattice
        and adds discrete Gaussian noise (accounted by RDP,
        :meth:`~fedpriv.accounting.checkin.gaussian.CheckinGaussianSpec.pass_event`)."""
        return self.privacy.lattice_noise

    def for_run(self, plan: RunPlan) -> CheckinGaussianClient:
        """Bind ``num_slots``, the run's clients and passes into the spec.

        Raises
        ------
        ConfigError
            For ``client_sampling`` other than ``all``.
        """
        check_cohort(plan, "checkin_gaussian")
        spec = self.privacy.bound(
            num_slots=self.num_slots, num_clients=plan.num_clients, num_rounds=plan.num_rounds
        )
        return replace(self, privacy=spec)

    def bound_spec(self) -> CheckinGaussianSpec:
        self._check_bound(self.privacy.num_rounds)
        return self.privacy

    @property
    def normalizer(self) -> float:
        """The public constant dividing a slot's noisy sum (``max(1, n p0 / m)``)."""
        return self.bound_spec().slot_divisor

    def train(
        self, model: nn.Module, data: ClientData, ctx: TrainContext
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """The gradient of the mean loss at ``model``, L2-clipped to ``C`` (no noise)."""
        grad, loss = mean_loss_gradient(model, data, ctx.device)
        keys = list(grad)
        clip = self.bound_spec().clipping_norm
        clipped = clip_tensors([grad[k] for k in keys], clip)
        return {k: v.cpu() for k, v in zip(keys, clipped, strict=True)}, {
            "examples": float(len(data)),
            "loss": loss,
        }


def slot_report(
    algorithm: CheckinParticipant,
    plan: RunPlan,
    model: nn.Module,
    data: ClientData,
    server_round: int,
    slot: int,
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """One client's report for one slot: its update at ``model`` (which holds the block's
    model).

    The generator is seeded from ``(seed, pass, slot, partition_id)`` (OS entropy in
    ``secure_mode``), so two reports of one client (the Poisson baseline may sample it in
    several slots of a pass) never share noise. Returns the update as CPU numpy arrays
    (parameter shapes) and the client's metrics.
    """
    device = next(model.parameters()).device
    secure = plan.secure_mode
    rng = np.random.default_rng(
        None if secure else [plan.seed, server_round, slot, int(data.partition_id)]
    )
    generator = make_generator(int(rng.integers(2**62)), device=device, secure_mode=secure)
    update, metrics = algorithm.train(
        model, data, TrainContext(server_round, rng, generator, device)
    )
    return {k: v.detach().cpu().contiguous().numpy() for k, v in update.items()}, metrics


def slot_update(
    algorithm: CheckinParticipant,
    plan: RunPlan,
    msg: Message,
    partition_id: int,
    server_round: int,
    slot: int,
) -> Message:
    """Reply to a one-client slot message with the client's update at the received model
    (:func:`slot_report`; the reply holds that client's update and metrics, unstacked)."""
    torch.set_num_threads(1)
    data = client_data(plan.to_payload(), partition_id)
    model = build_model_for(plan).to(resolve_device(plan))
    model.load_state_dict(msg.content.array_records[MODEL_KEY].to_torch_state_dict())
    update, metrics = slot_report(algorithm, plan, model, data, server_round, slot)
    content = RecordDict(
        {
            UPDATE_KEY: ArrayRecord({k: torch.from_numpy(v) for k, v in update.items()}),
            METRICS_KEY: MetricRecord({k: float(v) for k, v in metrics.items()}),
        }
    )
    return Message(content=content, reply_to=msg)
