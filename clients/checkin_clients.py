"""Random check-ins, client side: the check-in decision and one locally randomized update.

"Privacy Amplification via Random Check-Ins" (Balle, Bell, Gascon, Kairouz, Thakurta,
arXiv:2007.06605). The server never samples clients: it sends a check-in query (a Flower
``query`` message) to every WORKER node naming the virtual clients it hosts
(:mod:`fedpriv.run.engine`), and each client, with ITS OWN randomness, participates with
probability ``checkin_probability`` ``p0`` and picks a slot uniformly from its window ``R_j``
(:func:`fedpriv.mechanisms.checkin_draw.draw_checkin`). The worker remembers its clients' slots in its Flower
``Context.state`` and answers, per client, with the slot or ``ABSTAIN``. When the server
later asks a client for the update of that slot it computes, at the model it receives, the
gradient of its mean loss over its own data, clips it to ``clipping_norm`` ``L`` and applies
the local randomizer (:class:`fedpriv.mechanisms.randomizers.LocalRandomizer`): ``gaussian`` (l2 clip,
analytic Gaussian calibrated to (``local_epsilon``, ``local_delta``) at l2 sensitivity ``2L``)
or ``laplace`` (l1 clip, ``Laplace(2L / local_epsilon)``, pure ``local_epsilon``-DP).

The report is sent as it is: nothing divides it (``normalizer = 1``), in particular not the
client's data size; the mean loss only averages inside the gradient, before clipping, so the
clipped report lies in the ball of radius ``L`` whatever the data.

The mechanism, its validation, events and calibration live in
:class:`fedpriv.accounting.checkin.CheckinSpec`, which this client builds once from its
fields and the run's ``privacy`` group (``fedpriv-account checkin`` builds the same spec).
A client is one virtual client of a worker; its privacy unit is all its rows (replace-one
neighbours).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, cast

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from torch import nn

from fedpriv.accounting.checkin import CheckinSpec, CheckinVariant
from fedpriv.accounting.checkin_gaussian import CheckinGaussianSpec, CheckinNoise
from fedpriv.accounting.ledger import FedprivEvent
from fedpriv.accounting.accountant import AccountingSpec
from fedpriv.accounting.vocabulary import NeighboringRelation
from fedpriv.common.validate import parse_enum
from fedpriv.common.errors import ConfigError, check
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
from fedpriv.mechanisms.checkin_draw import checkin_rng, checkin_window, draw_checkin
from fedpriv.mechanisms.clipping import clip_tensors
from fedpriv.mechanisms.randomizers import LocalRandomizer
from fedpriv.run.algorithm import ClientAlgorithm, TrainContext
from fedpriv.data.client_data import ClientData
from fedpriv.run.engine import named_clients, row_blocks, stacked_reply

__all__ = [
    "CheckinClient",
    "CheckinGaussianClient",
    "mean_cross_entropy",
    "slot_report",
    "slot_update",
]


def mean_cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the client's data (its empirical loss)."""
    return nn.functional.cross_entropy(out, y)


@dataclass(frozen=True)
class CheckinClient(ClientAlgorithm):
    """A random check-in client: one clipped, locally randomized gradient per check-in.

    Parameters
    ----------
    variant : {"fixed", "averaged", "sliding-window", "poisson"}
        The protocol (:class:`~fedpriv.accounting.checkin.CheckinVariant`); the server
        strategy follows it.
    num_slots : int
        ``m >= 1``: slots of a pass (``fixed``, ``averaged``, ``poisson``: model steps of a
        pass) or the window length (``sliding-window``, ``m <= num_clients``).
    randomizer : {"gaussian", "laplace"}
        The local randomizer (:class:`~fedpriv.mechanisms.randomizers.LocalRandomizer`).
    window : [first, last] or None
        ``R_j`` for ``fixed`` / ``averaged`` (default ``[1, m]``, the only window Theorems
        3.2 / 4.1 cover); null for the sliding window.
    client_sample_rate : float or None
        ``poisson`` only: the server's per-step client sampling rate ``q`` (default
        ``checkin_probability / num_slots``).
    privacy : dict
        The run's ``privacy`` group: ``local_epsilon``, ``local_delta``, ``clipping_norm``,
        ``checkin_probability`` (``p0``), ``target_delta``, ``secure_mode``.
    num_clients : int
        ``n``.
    num_rounds : int or None
        Passes of the run (set by :meth:`for_run`; used for the bound in the summary).
    noise : {"local"}
        Local randomizers only (:class:`CheckinGaussianClient` runs ``central_gaussian``).

    Raises
    ------
    ConfigError
        One line naming the field (from :class:`~fedpriv.accounting.checkin.CheckinSpec`).
    """

    variant: str = "fixed"
    num_slots: int = 100
    randomizer: str = "laplace"
    window: list[int] | None = None
    client_sample_rate: float | None = None
    privacy: dict[str, Any] = field(default_factory=dict)
    num_clients: int = 1
    num_rounds: int | None = None
    noise: str = "local"
    spec: CheckinSpec = field(init=False, repr=False, compare=False)

    #: The central ledger's neighbouring relation (the paper's: replace one client's data).
    neighboring_relation: ClassVar[str] = "replace_one"
    #: Group privacy is not computed for check-ins (``privacy.group_sizes`` is not used).
    supports_group_privacy: ClassVar[bool] = False

    def __post_init__(self) -> None:
        noise = parse_enum(CheckinNoise, "client.noise", self.noise)
        check(
            noise is CheckinNoise.LOCAL,
            "client.noise",
            noise.value,
            "needs client=checkin_gaussian privacy=checkin_gaussian (central Gaussian slot sums, "
            "clients.checkin_clients.CheckinGaussianClient); client=checkin runs local randomizers",
        )
        spec = CheckinSpec.from_privacy(
            self.privacy,
            num_clients=self.num_clients,
            variant=self.variant,
            num_slots=self.num_slots,
            randomizer=self.randomizer,
            window=self.window,
            client_sample_rate=self.client_sample_rate,
        )
        if self.num_rounds is not None:
            spec.check_passes(int(self.num_rounds))
        object.__setattr__(self, "spec", spec)
        object.__setattr__(self, "variant", spec.variant)

    def for_run(self, cfg: dict[str, Any]) -> CheckinClient:
        """A copy that knows the run's ``num_rounds`` (passes).

        Raises
        ------
        ConfigError
            For ``client_sampling`` other than ``all``: check-in clients decide themselves
            whether to take part (``privacy.checkin_probability``); a server cohort would be
            another protocol, which the check-in analysis does not cover.
        """
        sampling = str(cfg.get("client_sampling", "all"))
        if sampling != "all":
            raise ConfigError(
                "client_sampling",
                sampling,
                "is not supported with client=checkin (each client decides itself whether "
                "to check in, privacy.checkin_probability): use client_sampling=all",
            )
        return replace(self, num_rounds=int(cfg["num_rounds"]))

    # -- parameters (the spec's) --------------------------------------------------------
    @property
    def local_epsilon(self) -> float:
        return self.spec.local_epsilon

    @property
    def local_delta(self) -> float:
        return self.spec.local_delta

    @property
    def clipping_norm(self) -> float:
        return self.spec.clipping_norm

    @property
    def checkin_probability(self) -> float:
        return self.spec.checkin_probability

    @property
    def sample_rate(self) -> float:
        """``poisson``: the per-step client sampling rate ``q``."""
        return self.spec.sample_rate

    @property
    def local_randomizer(self) -> LocalRandomizer:
        return self.spec.local_randomizer

    @property
    def event(self) -> FedprivEvent:
        """The central privacy event of one pass."""
        return self.spec.pass_event()

    @property
    def steps(self) -> int:
        """Model-update slots per pass (``n - m + 1`` for the sliding window)."""
        return self.spec.steps

    @property
    def normalizer(self) -> float:
        """The public constant dividing a client's report: 1 (see the spec)."""
        return self.spec.normalizer

    # -- privacy --------------------------------------------------------------------
    def round_events(self) -> list[tuple[Any, int]]:
        """One pass (fresh check-ins) per server round: ``[(event, 1)]``."""
        return self.spec.round_events()

    def local_events(self) -> list[tuple[Any, int]]:
        """A client sends at most one randomized update per pass."""
        return self.spec.local_events()

    def privacy_report(self, rounds: int, target_delta: float) -> dict[str, float]:
        """Each client's local ``eps0`` (and ``delta0``) per release, printed with every pass."""
        out = {"local_epsilon0": self.local_epsilon}
        if self.local_delta > 0:
            out["local_delta0"] = self.local_delta
        return out

    def privacy_summary(self) -> dict[str, Any]:
        """``results.json``'s privacy block: normalizer, randomizer, and which bound answers
        after the run's passes (the theorem or the local cap, with the reason)."""
        return self.spec.summary(self.num_rounds)

    def calibrated(
        self, target_epsilon: float, target_delta: float, num_rounds: int
    ) -> CheckinClient:
        """A copy whose ``local_epsilon`` is the largest with central epsilon <= target after
        ``num_rounds`` passes (:meth:`CheckinSpec.calibrated`).

        Raises
        ------
        ConfigError
            If even a tiny ``eps0`` misses the target.
        """
        spec = self.spec.calibrated(target_epsilon, target_delta, num_rounds)
        privacy = {**self.privacy, "local_epsilon": spec.local_epsilon, "target_epsilon": None}
        return dataclasses.replace(self, privacy=privacy)

    # -- client computation -----------------------------------------------------------
    def train(
        self, model: nn.Module, data: ClientData, ctx: TrainContext
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """``A_ldp(theta; d_j)``: the randomized clipped gradient of the mean loss at ``model``."""
        params = dict(model.named_parameters())
        x, y = data.x.to(ctx.device), data.y.to(ctx.device)
        loss = mean_cross_entropy(model(x), y)
        grads = torch.autograd.grad(loss, list(params.values()))
        grad = {k: g.detach() for k, g in zip(params, grads, strict=True)}
        update = self.local_randomizer.randomize(grad, ctx.generator)
        return {k: v.cpu() for k, v in update.items()}, {
            "examples": float(len(data)),
            "loss": float(loss.detach()),
            "noise_draws": 1.0,  # one randomized report: the local event's count per pass
        }

    def query_handler(self, cfg: dict[str, Any], msg: Message, context: Context) -> Message:
        """A worker answers a check-in query for every virtual client the query names.

        The query's ConfigRecord ``checkin`` carries ``server_round`` (the pass), ``variant``
        and ``num_slots`` (they must match this client's protocol); its ``config`` record names
        the worker's clients (``clients``, :func:`fedpriv.run.engine.named_clients`). Each client
        draws its check-in with ITS OWN RNG, seeded from ``(seed, pass, client id)`` (OS
        entropy in ``secure_mode``; :func:`fedpriv.mechanisms.checkin_draw.checkin_rng`), exactly as a node of
        its own did: the slot (``ABSTAIN`` = -1) and then a random ``ticket`` from the same RNG
        (independent of the data; the server orders a slot's check-ins by ticket before its
        uniform pick). The reply's ``checkin`` record holds the lists ``clients``, ``slots``
        and ``tickets`` (same order): slot occupancy only, no data. The worker remembers the
        slots in its Flower ``Context.state`` to verify later update requests.

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
        secure = bool(cfg["privacy"].get("secure_mode"))
        seed, p0, m = int(cfg["seed"]), self.checkin_probability, int(self.num_slots)
        slots, tickets = [], []
        for pid in clients:
            rng = checkin_rng(seed, server_round, pid, secure)
            slots.append(draw_checkin(rng, p0, checkin_window(self.variant, m, pid)))
            tickets.append(int(rng.integers(2**62)))
        context.state[CHECKIN_KEY] = ConfigRecord(
            {"server_round": server_round, CLIENTS_KEY: clients, "slots": slots}
        )
        answer = ConfigRecord({CLIENTS_KEY: clients, "slots": slots, "tickets": tickets})
        return Message(content=RecordDict({CHECKIN_KEY: answer}), reply_to=msg)

    def train_message_handler(self, cfg: dict[str, Any], msg: Message, context: Context) -> Message:
        """A worker sends the slot updates of the (client id, slot) pairs the message names.

        The message's ``config`` record carries ``server_round``, ``clients`` and ``slots``
        (pair ``i`` is ``(clients[i], slots[i])``; the Poisson baseline may name a client in
        several slots) and the model of the block. Each asked client computes ``A_ldp`` at that
        model with its own data and a generator seeded from ``(seed, pass, slot, client id)``
        (:func:`slot_report`), but only for the (pass, slot) it checked into (``poisson``, the
        server-sampled baseline, has no check-in to verify): a request for any other slot is
        refused for that client. The reply stacks the updates (:func:`fedpriv.run.engine.stacked_reply`)
        with the pairs that succeeded in ``clients`` / ``slots``; refused or failed clients are
        listed in ``failed`` with their error line. Each row's metrics include ``compute_s``,
        the client's own compute time (load of the model, gradient, randomizer) in seconds.
        """
        import json
        import time

        from fedpriv.run.client_app import _client_data, _model

        torch.set_num_threads(1)
        conf = msg.content.config_records[CONFIG_KEY]
        server_round = record_int(conf, "server_round")
        clients = named_clients(msg) or []
        slots = [int(s) for s in conf["slots"]]  # type: ignore[union-attr]
        checked = self._checked_in(context, server_round, clients)
        cfg_json = json.dumps(cfg, sort_keys=True)
        model = _model(cfg_json)
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
                data = _client_data(cfg_json, pid)
                update, m = slot_report(self, cfg, model, data, server_round, slot)
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


def slot_report(
    algorithm: CheckinClient,
    cfg: dict[str, Any],
    model: nn.Module,
    data: ClientData,
    server_round: int,
    slot: int,
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """One client's report for one slot: ``A_ldp`` at ``model`` (which holds the block's model).

    The generator is seeded from ``(seed, pass, slot, partition_id)`` (OS entropy in
    ``secure_mode``), so two reports of one client (the Poisson baseline may sample it in
    several slots of a pass) never share noise. Returns the update as CPU numpy arrays
    (parameter shapes) and the client's metrics.
    """
    from fedpriv.mechanisms.noise import make_generator

    device = next(model.parameters()).device
    secure = bool(cfg["privacy"].get("secure_mode"))
    rng = np.random.default_rng(
        None if secure else [int(cfg["seed"]), server_round, slot, int(data.partition_id)]
    )
    generator = make_generator(int(rng.integers(2**62)), device=device, secure_mode=secure)
    update, metrics = algorithm.train(
        model, data, TrainContext(server_round, rng, generator, device)
    )
    return {k: v.detach().cpu().contiguous().numpy() for k, v in update.items()}, metrics


def slot_update(
    algorithm: CheckinClient,
    cfg: dict[str, Any],
    msg: Message,
    partition_id: int,
    server_round: int,
    slot: int,
) -> Message:
    """Reply to a one-client slot message with ``A_ldp`` at the received model
    (:func:`slot_report`; the reply holds that client's update and metrics, unstacked)."""
    import json

    from flwr.app import ArrayRecord, MetricRecord

    from fedpriv.run.client_app import _client_data
    from fedpriv.run.setup import build_model_for, resolve_device

    torch.set_num_threads(1)
    data = _client_data(json.dumps(cfg, sort_keys=True), partition_id)
    model = build_model_for(cfg).to(resolve_device(cfg))
    model.load_state_dict(msg.content.array_records[MODEL_KEY].to_torch_state_dict())
    update, metrics = slot_report(algorithm, cfg, model, data, server_round, slot)
    content = RecordDict(
        {
            UPDATE_KEY: ArrayRecord({k: torch.from_numpy(v) for k, v in update.items()}),
            METRICS_KEY: MetricRecord({k: float(v) for k, v in metrics.items()}),
        }
    )
    return Message(content=content, reply_to=msg)


@dataclass(frozen=True)
class CheckinGaussianClient(CheckinClient):
    """Check-ins as participation with CENTRAL Gaussian noise (``client=checkin_gaussian``).

    The fixed window only (``R_j = [m]``): each client checks in with probability ``p0``
    (``privacy.checkin_probability``) into one uniform slot, exactly as :class:`CheckinClient`
    (same query handling, same per-client RNG). When asked, it sends the gradient of its mean
    loss at the slot's model, L2-clipped to ``privacy.clipping_norm`` ``C``, WITHOUT local
    noise: EVERY checked-in client of a slot sends, and the trusted aggregator releases the
    slot's sum plus ``N(0, σ² C² I)`` (``privacy.noise_multiplier`` σ), drawn by
    :meth:`~fedpriv.accounting.checkin_gaussian.CheckinGaussianSpec.slot_noise` of the same
    spec that states the events; empty slots release the noise alone. The server divides by
    the public constant ``max(1, n p0 / m)``.

    Accounting (:mod:`fedpriv.accounting.checkin_gaussian`): the Poisson(``p0``)-subsampled
    random-allocation PLD, add/remove one client; the paper's Theorem 3.2 is reported as not
    applicable (a slot sums several clients). Both routes are in ``results.json``.

    Notes
    -----
    ε covers the released slot sums (hence the models). The trusted server also sees who
    checked in where; the per-pass figures it prints (check-ins, per-slot loads, empty
    slots) are its diagnostics, outside the accounted release, like a Poisson run's realized
    cohort size.

    Raises
    ------
    ConfigError
        For a variant other than ``fixed``, ``privacy.local_epsilon`` set, σ missing or not
        > 0, a window other than ``[1, m]``, ``client_sample_rate`` set, or an accountant
        other than ``pld``.
    """

    variant: str = "fixed"
    noise: str = "central_gaussian"
    gaussian: CheckinGaussianSpec = field(init=False, repr=False, compare=False)

    #: Random allocation's PLD is add/remove (one client present or absent).
    neighboring_relation: ClassVar[str] = "add_remove"
    #: Marks the strategy's central-Gaussian slot mode (every check-in sends; server noise).
    central_gaussian: ClassVar[bool] = True

    def __post_init__(self) -> None:
        p = self.privacy
        noise = parse_enum(CheckinNoise, "client.noise", self.noise)
        check(
            noise is CheckinNoise.CENTRAL_GAUSSIAN,
            "client.noise",
            noise.value,
            "must be central_gaussian for client=checkin_gaussian (local: client=checkin)",
        )
        check(
            str(self.variant) == CheckinVariant.FIXED.value,
            "client.variant",
            self.variant,
            "must be fixed for client=checkin_gaussian (only R_j = [m] is accounted)",
        )
        check(
            p.get("local_epsilon") is None,
            "privacy.local_epsilon",
            p.get("local_epsilon"),
            "must be null with client=checkin_gaussian (central noise: privacy.noise_multiplier)",
        )
        check(
            self.client_sample_rate is None,
            "client.client_sample_rate",
            self.client_sample_rate,
            "is only used by client=checkin client.variant=poisson",
        )
        m = self.num_slots
        if self.window is not None:
            check(
                list(self.window) == [1, m],
                "client.window",
                list(self.window),
                f"must be null or [1, {m}]: only R_j = [m] is accounted",
            )
        sigma = p.get("noise_multiplier")
        if sigma is None and p.get("target_epsilon") is not None:
            sigma = 1.0  # placeholder: calibrated() replaces it before anything runs
        check(
            sigma is not None,
            "privacy.noise_multiplier",
            sigma,
            "must be set (> 0) for client=checkin_gaussian, or give privacy.target_epsilon",
        )
        try:
            spec = CheckinGaussianSpec(
                noise_multiplier=float(sigma),  # type: ignore[arg-type]
                num_slots=int(m),
                checkin_probability=float(p.get("checkin_probability", 1.0)),
                num_clients=int(self.num_clients),
                clipping_norm=float(p.get("clipping_norm", 1.0)),
                accounting=AccountingSpec.from_privacy(
                    dict(p), neighboring_relation=NeighboringRelation.ADD_REMOVE
                ),
            )
        except ConfigError as exc:
            name = exc.field if "." in exc.field else f"privacy.{exc.field}"
            if exc.field == "num_slots":
                name = "client.num_slots"
            raise ConfigError(name, exc.value, exc.allowed) from None
        object.__setattr__(self, "gaussian", spec)
        object.__setattr__(self, "variant", CheckinVariant.FIXED)

    # -- parameters ---------------------------------------------------------------------
    @property
    def local_epsilon(self) -> float:
        raise NotImplementedError("client=checkin_gaussian has no local randomizer")

    @property
    def local_delta(self) -> float:
        return 0.0

    @property
    def local_randomizer(self) -> LocalRandomizer:
        raise NotImplementedError("client=checkin_gaussian has no local randomizer")

    @property
    def sample_rate(self) -> float:
        raise NotImplementedError("client=checkin_gaussian has no server-side sampling rate")

    @property
    def clipping_norm(self) -> float:
        return self.gaussian.clipping_norm

    @property
    def checkin_probability(self) -> float:
        return self.gaussian.checkin_probability

    @property
    def event(self) -> FedprivEvent:
        return self.gaussian.pass_event()

    @property
    def steps(self) -> int:
        return int(self.num_slots)

    @property
    def normalizer(self) -> float:
        """The public constant dividing a slot's noisy sum (``max(1, n p0 / m)``)."""
        return self.gaussian.slot_divisor

    # -- privacy --------------------------------------------------------------------
    def round_events(self) -> list[tuple[Any, int]]:
        """One pass (fresh check-ins) per server round."""
        return self.gaussian.round_events()

    def local_events(self) -> list[tuple[Any, int]]:
        """No local DP: the clipped gradients go to the trusted aggregator unnoised."""
        return []

    def privacy_report(self, rounds: int, target_delta: float) -> dict[str, float]:
        return {}

    def privacy_summary(self) -> dict[str, Any]:
        """``results.json``: both routes (random allocation's ε, Theorem 3.2 not applicable
        with its reason), which one answered, the noise and the normalizer."""
        out = self.gaussian.summary(self.num_rounds)
        out["normalizer"] = self.normalizer
        return out

    def calibrated(
        self, target_epsilon: float, target_delta: float, num_rounds: int
    ) -> CheckinGaussianClient:
        """A copy with the smallest σ whose ε after ``num_rounds`` passes is <= the target."""
        acc = dataclasses.replace(self.gaussian.accounting, target_delta=target_delta)
        spec = dataclasses.replace(self.gaussian, accounting=acc).calibrated(
            target_epsilon, num_rounds
        )
        privacy = {**self.privacy, "noise_multiplier": spec.noise_multiplier}
        privacy["target_epsilon"] = None
        return dataclasses.replace(self, privacy=privacy)

    def slot_noise(
        self, shapes: dict[str, tuple[int, ...]], generator: torch.Generator
    ) -> dict[str, np.ndarray]:
        """The aggregator's Gaussian for one slot's sum (the spec that states the events)."""
        return self.gaussian.slot_noise(shapes, generator)

    # -- client computation -----------------------------------------------------------
    def train(
        self, model: nn.Module, data: ClientData, ctx: TrainContext
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """The gradient of the mean loss at ``model``, L2-clipped to ``C`` (no noise)."""
        params = dict(model.named_parameters())
        x, y = data.x.to(ctx.device), data.y.to(ctx.device)
        loss = mean_cross_entropy(model(x), y)
        grads = torch.autograd.grad(loss, list(params.values()))
        keys = list(params)
        clipped = clip_tensors([g.detach() for g in grads], self.clipping_norm)
        return {k: v.cpu() for k, v in zip(keys, clipped, strict=True)}, {
            "examples": float(len(data)),
            "loss": float(loss.detach()),
        }
