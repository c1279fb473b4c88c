"""Generalized DP-SGD (the first paper's Algorithm 1): shuffling, batch clipping, any optimizer.

Per local round the client draws ``S_b`` (``m`` groups of ``s`` records) with
``Sample_{s,m}``; each group runs the local optimizer ``A`` from the same round model ``w``
and yields ``a_h = (w - w_end) / eta``; ``U = sum_h [a_h]_C``; the client adds
``N(0, (2 C sigma)^2 I)`` and applies ``U_bar = (U + noise) / m`` to its local model
(``w <- w - eta U_bar``). It sends the sum of its ``U_bar`` steps (post-processing of
releases that are each private on their own, so no secure aggregation is assumed).

``s = 1`` with ``A`` = one gradient is classic DP-SGD ("individual clipping"); ``m = 1`` is
batch clipping. With the Poisson sampler (individual clipping only) the noise is
``N(0, (C sigma)^2 I)``, every record of the client is drawn with probability ``q``,
``U_bar = (U + noise) / m`` (``m`` = the public expected batch size) and the standard
Poisson-subsampled Gaussian analysis (add/remove relation) applies; shuffling is accounted by
the exact f-DP mixture of :mod:`fedpriv.accounting.batch_clipping.spec` and subsampling by the
fixed-size sampled Gaussian (replace-one relation, sensitivity 2C; ``analysis=paper``: the
mixture).

The divisor ``m`` (:attr:`GeneralizedDPSGD.normalizer`) is a public constant of the config,
the same for every client and never a client's data size; every client runs the same number
of local rounds (one noise draw each). A record's influence on one step is at most ``2 C / m``
(``C / m`` for Poisson) and the step's noise std ``2 C sigma / m`` (``C sigma / m``), so every
record, in any client of any size, has noise multiplier sigma in its client's release (and
more in the released sum, which adds the other clients' noise).

References
----------
van Dijk, Nguyen, Nguyen, Phan, "Generalizing DP-SGD with Shuffling and Batch Clipping"
(arXiv:2212.05796): Algorithm 1, Sec. 3, Sec. 5, Table 1. Abadi et al. 2016 (DP-SGD).
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from clients.local_dpsgd import summed_cross_entropy
from fedpriv.accounting.batch_clipping.spec import Analysis, BatchClippingSpec
from fedpriv.accounting.core.privacy_spec import PrivacySpec
from fedpriv.accounting.secure_mode import lattice_bound
from fedpriv.common.errors import ConfigError, check, unknown_key
from fedpriv.common.validate import check_finite, parse_enum
from fedpriv.data.client_data import ClientData
from fedpriv.mechanisms.clipping import clip_tensors
from fedpriv.mechanisms.ghost import batch_clipped_grad, refuse_cross_sample
from fedpriv.mechanisms.lattice_gaussian import add_lattice_gaussian, lattice_step
from fedpriv.mechanisms.noise import add_gaussian_noise
from fedpriv.mechanisms.persample import clipped_grad_sum, clipped_group_grad_sum
from fedpriv.mechanisms.samplers import (
    PoissonSampler,
    SamplerKind,
    ShuffleSampler,
    SubsampleSampler,
)
from fedpriv.run.algorithm import ClientAlgorithm, TrainContext, check_spec
from fedpriv.run.plan import RunPlan
from fedpriv.run.setup import build_model_for, partitions

GROUP_UPDATES = ("minibatch", "sequential")
LR_SCHEDULES = ("constant", "diminishing", "cosine")
#: Why ``privacy.secure_mode=true`` refuses fixed-size groups, and what to use instead.
SECURE_SAMPLER_REFUSAL = (
    "has no lattice-noise analysis with privacy.secure_mode=true (shuffled and subsampled "
    "groups are accounted by the continuous Gaussian's f-DP mixture or fixed-size PLD): use "
    "client.sampler=poisson "
    "client.group_size=1 (lattice discrete Gaussian, accounted by RDP)"
)
Update = dict[str, torch.Tensor]
#: From this many groups on, one vmap over the groups beats a loop of mini-batch gradients
#: (measured on CPU, 1 thread, batch 64: tanh CNN 16.8 vs 12.1 ms a step at m = 4, 17.6 vs
#: 30.5 ms at m = 16; logistic 2.6 vs 1.6 ms at m = 4, 2.6 vs 5.1 ms at m = 16).
VMAP_MIN_GROUPS = 8


def step_size(schedule: str, lr: float, t: int, tau: float, period: int | None) -> float:
    """Step size ``eta_t`` of local round ``t`` (0-based, counted over the whole run).

    ``constant``: ``eta0``; ``diminishing``: ``eta0 / (1 + t / tau)``; ``cosine``:
    ``eta0 (1 + cos(pi min(t, P) / P)) / 2`` with ``P = period`` local rounds.
    """
    if schedule == "diminishing":
        return lr / (1.0 + t / tau)
    if schedule == "cosine":
        assert period is not None
        return lr * 0.5 * (1.0 + math.cos(math.pi * min(t, period) / period))
    return lr


def optimizer_class(target: Any) -> type[torch.optim.Optimizer]:
    """Resolve ``client.optimizer._target_`` to a torch optimizer class.

    Raises
    ------
    ConfigError
        If the target is not importable or not a ``torch.optim.Optimizer`` subclass.
    """
    module, _, name = str(target).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name, None) if module else None
    except ImportError:
        cls = None
    check(
        isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer),
        "client.optimizer._target_",
        target,
        "must name a torch.optim.Optimizer class (e.g. torch.optim.SGD, torch.optim.Adam)",
    )
    return cls  # type: ignore[return-value]


def check_optimizer(spec: dict[str, Any], lr: float) -> None:
    """Build ``spec``'s optimizer on one parameter and take one step, before any training.

    Raises
    ------
    ConfigError
        Naming ``client.optimizer.KEY`` for a keyword the optimizer does not take, else
        ``client.optimizer`` with the optimizer's own message (a bad value, or a ``step`` that
        needs a closure, like L-BFGS).
    """
    cls = optimizer_class(spec.get("_target_"))
    kwargs = {k: v for k, v in spec.items() if k != "_target_"}
    p = torch.zeros(2, requires_grad=True)
    try:
        opt = cls([p], **{**kwargs, "lr": lr})
        p.grad = torch.ones(2)
        opt.step()
    except Exception as exc:  # noqa: BLE001 - the optimizer's own message is the clearest
        key = unknown_key(kwargs, exc)
        if key is not None:
            raise ConfigError(
                f"client.optimizer.{key}", kwargs[key], f"is not a parameter of {spec['_target_']}"
            ) from None
        raise ConfigError(
            "client.optimizer", spec, f"cannot run as the local optimizer A: {exc}"
        ) from None


def is_plain_sgd(spec: dict[str, Any]) -> bool:
    """True if ``spec`` is ``torch.optim.SGD`` with every given keyword at SGD's default (the
    fast paths compute exactly this update); any other setting takes the general path."""
    if optimizer_class(spec.get("_target_")) is not torch.optim.SGD:
        return False
    defaults = {k: v.default for k, v in inspect.signature(torch.optim.SGD).parameters.items()}
    return all(
        k == "lr" or (k in defaults and v == defaults[k])
        for k, v in spec.items()
        if k != "_target_"
    )


@dataclass(frozen=True)
class GeneralizedDPSGD(ClientAlgorithm):
    """Algorithm 1 of the batch-clipping paper as a fedpriv client algorithm (batch clipping:
    ``client=batch_clipping``, whose defaults are this class's).

    The mechanism is the run's :class:`fedpriv.accounting.batch_clipping.spec.BatchClippingSpec`
    (``privacy=batch_clipping``: σ, C, q, group sizes, accounting) with this client's sampler,
    sizes, rounds and analysis bound into it (and ``N`` by :meth:`for_run`): events, ε, group
    ε, calibration and the public :attr:`normalizer` are the spec's. ``fedpriv-account
    batch-clipping`` builds the same spec.

    Parameters
    ----------
    sampler : {"shuffle", "subsample", "poisson"}
        ``Sample_{s,m}``; ``poisson`` (rate ``privacy.sample_rate``, every record of the
        client) only with ``group_size=1``.
    num_groups, group_size : int
        ``m`` groups of ``s`` records per local round (``m s <= N``). ``m`` is the public
        divisor of every noisy step (for Poisson: the expected batch size).
    local_rounds, epochs : int, optional
        Local rounds per server round, or whole epochs (``N // (m s)`` rounds each; for
        Poisson ``round(1/q)``); give exactly one. The same for every client.
    group_update : {"minibatch", "sequential"}
        ``A``: one optimizer step on the group's mean loss at ``w`` (for plain SGD: one
        mini-batch gradient), or one step per record in sequence (classical SGD).
    optimizer : dict
        ``{"_target_": "torch.optim.SGD" | "torch.optim.Adam" | ..., **kwargs}`` (lr is set
        per round from the schedule). Kept as data: the config's nested ``_target_`` is not
        instantiated (:attr:`recursive_config` is False); the client builds one optimizer per
        group.
    lr, lr_schedule, lr_tau, lr_period :
        ``eta0`` > 0; schedule constant | diminishing (``eta0/(1+t/tau)``) | cosine (period
        ``lr_period`` local rounds).
    clipping_norms : list of float, optional
        ``C`` per server round (last value repeated); default ``privacy.clipping_norm``.
    analysis : {"auto", "without-replacement", "paper", "poisson-gaussian"}
        ``auto`` (default): the tightest valid analysis for the sampler (subsampling: the
        fixed-size sampled Gaussian; shuffling: the paper's mixture; Poisson: the
        Poisson-sampled Gaussian); ``paper`` the paper's f-DP mixture (``batch-clipping``, its
        earlier name, still accepted). Refused unless it covers the sampler
        (:class:`fedpriv.accounting.batch_clipping.spec.Analysis`).
    num_samples : int, optional
        ``N`` used by every client (the smallest partition; bound by :meth:`for_run`; unused
        with Poisson sampling).
    seed : int
        The run's seed (shuffled epochs spanning server rounds are derived from it; bound by
        :meth:`for_run`).
    privacy : BatchClippingSpec
        The run's privacy spec (``privacy=batch_clipping``); the fields above are bound into
        it.

    Raises
    ------
    ConfigError
        On any out-of-range, non-finite or uncovered setting, naming the field.

    References
    ----------
    van Dijk, Nguyen, Nguyen, Phan, "Generalizing DP-SGD with Shuffling and Batch Clipping"
    (arXiv:2212.05796): Algorithm 1, Sec. 3, Sec. 5, Table 1.
    """

    spec_type: ClassVar[type[PrivacySpec]] = BatchClippingSpec
    recursive_config: ClassVar[bool] = False
    bound_fields: ClassVar[tuple[str, ...]] = ("num_samples", "seed")

    sampler: SamplerKind = SamplerKind.SHUFFLE
    num_groups: int = 1
    group_size: int = 64
    local_rounds: int | None = None
    epochs: int | None = 1
    group_update: str = "minibatch"
    optimizer: dict[str, Any] = field(default_factory=lambda: {"_target_": "torch.optim.SGD"})
    lr: float = 0.01
    lr_schedule: str = "constant"
    lr_tau: float = 100.0
    lr_period: int | None = None
    clipping_norms: list[float] | None = None
    analysis: Analysis = Analysis.AUTO
    num_samples: int | None = None
    seed: int = 0
    privacy: BatchClippingSpec = field(default_factory=BatchClippingSpec)

    def __post_init__(self) -> None:
        check_spec(self, BatchClippingSpec)
        check(
            isinstance(self.optimizer, Mapping) and self.optimizer.get("_target_") is not None,
            "client.optimizer",
            self.optimizer,
            "must be a mapping with _target_ (e.g. {_target_: torch.optim.SGD})",
        )
        set_ = object.__setattr__
        set_(self, "optimizer", dict(self.optimizer))
        if self.clipping_norms is not None and not isinstance(self.clipping_norms, list):
            set_(self, "clipping_norms", [float(c) for c in self.clipping_norms])
        sampler = parse_enum(SamplerKind, "client.sampler", self.sampler)
        set_(self, "sampler", sampler)
        set_(self, "analysis", parse_enum(Analysis, "client.analysis", self.analysis))
        self._check_training()
        if sampler is SamplerKind.POISSON:
            check(
                self.group_size == 1 and self.group_update == "minibatch" and self._plain_sgd,
                "client.group_size",
                self.group_size,
                "must be 1 with sampler=poisson, group_update=minibatch and plain SGD: only "
                "individual clipping has a Poisson analysis (noise N(0,(C sigma)^2))",
            )
        spec = self.privacy.bound(
            sampler=sampler,
            num_groups=self.num_groups,
            group_size=self.group_size,
            epochs=self.epochs,
            local_rounds=self.local_rounds,
            analysis=self.analysis,
            num_samples=None if sampler is SamplerKind.POISSON else self.num_samples,
        )
        if spec.secure_mode and not spec.non_private:
            check(spec.is_poisson, "client.sampler", sampler.value, SECURE_SAMPLER_REFUSAL)
            spec = lattice_bound(spec)
        set_(self, "privacy", spec)

    @property
    def hardened_noise(self) -> bool:  # type: ignore[override]
        """``privacy.secure_mode`` (Poisson sampling; fixed-size groups are refused): each
        local round's noisy sum is a lattice point with discrete Gaussian noise (safe against
        floating-point attacks), accounted by RDP whatever ``privacy.accountant`` says
        (:mod:`fedpriv.accounting.secure_mode`); otherwise float Gaussian noise."""
        return self.privacy.lattice_noise

    def _check_training(self) -> None:
        """The local optimizer, step sizes and per-round clipping norms."""
        check(
            self.group_update in GROUP_UPDATES,
            "client.group_update",
            self.group_update,
            f"must be one of {GROUP_UPDATES}",
        )
        lr = check_finite("client.lr", self.lr, "must be a finite number > 0")
        check(lr > 0, "client.lr", self.lr, "must be > 0")
        check_optimizer(self.optimizer, self.lr)
        check(
            self.lr_schedule in LR_SCHEDULES,
            "client.lr_schedule",
            self.lr_schedule,
            f"must be one of {LR_SCHEDULES}",
        )
        tau = check_finite("client.lr_tau", self.lr_tau, "must be a finite number > 0")
        check(tau > 0, "client.lr_tau", self.lr_tau, "must be > 0")
        if self.lr_schedule == "cosine":
            check(
                isinstance(self.lr_period, int) and self.lr_period >= 1,
                "client.lr_period",
                self.lr_period,
                "must be an integer >= 1 with lr_schedule=cosine",
            )
        if self.clipping_norms is not None:
            check(
                len(self.clipping_norms) >= 1
                and all(math.isfinite(float(c)) and c > 0 for c in self.clipping_norms),
                "client.clipping_norms",
                self.clipping_norms,
                "must be null or a non-empty list of finite values > 0",
            )

    # ------------------------------------------------------------------ derived values
    @property
    def normalizer(self) -> float:
        """``m``: the PUBLIC divisor of every noisy step, the same for every client."""
        return self.privacy.normalizer

    @property
    def _plain_sgd(self) -> bool:
        return is_plain_sgd(self.optimizer)

    def clipping_norm_at(self, server_round: int) -> float:
        """C of ``server_round`` (1-based) from ``clipping_norms``, else
        ``privacy.clipping_norm``."""
        if not self.clipping_norms:
            return self.privacy.clipping_norm
        return float(self.clipping_norms[min(server_round, len(self.clipping_norms)) - 1])

    # ------------------------------------------------------------------ binding to a run
    def for_run(self, plan: RunPlan) -> GeneralizedDPSGD:
        """Bind to a run: ``N`` = the smallest client partition (each client uses its first
        ``N`` records, so every client runs the same accounted mechanism and the same number
        of local rounds), the seed, and a check that the model has no BatchNorm under
        individual clipping. ``N`` is public under the replace-one relation of fixed-size
        batches (neighbouring data sets have the same sizes); Poisson sampling needs no
        ``N`` (every record of the client is drawn with probability ``q``).

        Raises
        ------
        ConfigError
            If ``m s > N``, a group size exceeds ``N``, or BatchNorm meets individual clipping.
        """
        n = None
        if not self.privacy.is_poisson:
            parts = partitions(plan)
            n = min(len(parts[i]) for i in range(len(parts)))
        bound = replace(self, num_samples=n, seed=int(plan.seed))
        if self.group_size == 1:
            refuse_cross_sample(build_model_for(plan))
        return bound

    # ------------------------------------------------------------------ training
    def _round_indices(
        self,
        t: int,
        n: int,
        ctx: TrainContext,
        partition_id: int,
        epoch_cache: dict[int, np.ndarray],
    ) -> np.ndarray:
        """Indices of local round ``t`` (global 0-based): ``(m, s)``, or ``(B, 1)`` for Poisson."""
        spec = self.privacy
        if spec.sampler is SamplerKind.POISSON:
            return PoissonSampler(spec.sample_rate).sample(n, ctx.rng).reshape(-1, 1)
        if spec.sampler is SamplerKind.SUBSAMPLE:
            return SubsampleSampler(self.num_groups, self.group_size).sample(n, ctx.rng)
        sampler = ShuffleSampler(self.num_groups, self.group_size)
        r = spec.rounds_per_epoch
        epoch, b = divmod(t, r)
        if epoch not in epoch_cache:
            aligned = spec.rounds_per_server_round % r == 0
            rng = (
                ctx.rng
                if aligned
                else np.random.default_rng([self.seed, partition_id, epoch, 0xBC])
            )
            epoch_cache[epoch] = sampler.epoch(n, rng)
        return epoch_cache[epoch][b]

    def _group_update(
        self,
        model: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        eta: float,
        w: Update,
        opt_cls: type[torch.optim.Optimizer],
    ) -> Update:
        """``a_h = (w - w_end) / eta`` of the optimizer run from ``w`` on one group (general
        path)."""
        params = dict(model.named_parameters())
        with torch.no_grad():
            for k, p in params.items():
                p.copy_(w[k])
        kwargs = {k: v for k, v in self.optimizer.items() if k != "_target_"}
        opt = opt_cls(list(params.values()), **{**kwargs, "lr": eta})
        batches = (
            [(x, y)]
            if self.group_update == "minibatch"
            else [(x[i : i + 1], y[i : i + 1]) for i in range(len(y))]
        )
        for xb, yb in batches:
            opt.zero_grad(set_to_none=True)
            (summed_cross_entropy(model(xb), yb) / len(yb)).backward()
            opt.step()
        with torch.no_grad():
            return {k: (w[k] - p.detach()) / eta for k, p in params.items()}

    def clipped_sum(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, eta: float, clipping_norm: float
    ) -> Update:
        """``U = sum_h [a_h]_C`` for groups ``x`` of shape ``(m, s, ...)`` at the model's ``w``.

        Fast paths for plain SGD with one mini-batch gradient per group: individual clipping
        (``s = 1``) uses :func:`fedpriv.mechanisms.persample.clipped_grad_sum` (classic
        DP-SGD), ``m = 1`` uses :func:`fedpriv.mechanisms.ghost.batch_clipped_grad`, ``m >= 8``
        one ``vmap`` over the groups (:func:`fedpriv.mechanisms.persample.clipped_group_grad_sum`;
        a loop with BatchNorm). ``w`` is left unchanged.
        """
        m, s = x.shape[0], x.shape[1]
        if self.group_update == "minibatch" and self._plain_sgd:
            if s == 1:
                return clipped_grad_sum(
                    model, summed_cross_entropy, x[:, 0], y[:, 0], clipping_norm
                )[0]
            if m >= VMAP_MIN_GROUPS:
                grouped = clipped_group_grad_sum(model, summed_cross_entropy, x, y, clipping_norm)
                if grouped is not None:
                    return grouped
            total: Update = {}
            for h in range(m):
                a = batch_clipped_grad(model, summed_cross_entropy, x[h], y[h], clipping_norm)
                total = a if not total else {k: total[k] + a[k] for k in total}
            return total
        opt_cls = optimizer_class(self.optimizer["_target_"])
        w = {k: p.detach().clone() for k, p in model.named_parameters()}
        total = {k: torch.zeros_like(v) for k, v in w.items()}
        for h in range(m):
            a = self._group_update(model, x[h], y[h], eta, w, opt_cls)
            clipped = clip_tensors(list(a.values()), clipping_norm)
            for k, c in zip(a, clipped, strict=True):
                total[k] += c
        with torch.no_grad():
            for k, p in model.named_parameters():
                p.copy_(w[k])
        return total

    def noisy(
        self, u: dict[str, torch.Tensor], std: float, clip_c: float, ctx: TrainContext
    ) -> dict[str, torch.Tensor]:
        """``U`` plus its noise: float Gaussian from ``ctx.generator``, or with
        :attr:`hardened_noise` ``γ (round(U/γ) + K)``, ``K`` discrete Gaussian of std
        ``std/γ`` drawn from ``ctx.rng`` (OS entropy in secure mode), ``γ`` the lattice step
        for sensitivity ``C`` (:func:`fedpriv.mechanisms.lattice_gaussian.lattice_step`)."""
        if not self.hardened_noise or std == 0:
            return add_gaussian_noise(u, std, ctx.generator)
        dim = sum(int(v.numel()) for v in u.values())
        arrays = {k: v.detach().double().cpu().numpy() for k, v in u.items()}
        lattice = add_lattice_gaussian(arrays, std, lattice_step(clip_c, dim), ctx.rng)
        return {k: torch.from_numpy(lattice[k]).to(u[k].device, u[k].dtype) for k in u}

    def train(
        self, model: nn.Module, data: ClientData, ctx: TrainContext
    ) -> tuple[Update, dict[str, float]]:
        """Run the server round's local rounds; return ``(w_end - w_start, metrics)``.

        Metrics: ``local_rounds`` and ``noise_draws`` (noise vectors drawn, one per local
        round: the events' count for one client), ``examples``, ``clipping_norm``. Every
        noisy step is divided by the public :attr:`normalizer` ``m``.
        """
        spec = self.privacy
        if spec.is_poisson:
            n = len(data)  # every record of the client, each with probability q
        else:
            n = spec.samples_used
            check(
                len(data) >= n,
                "client.num_samples",
                n,
                f"exceeds client {data.partition_id}'s {len(data)} samples",
            )
        model.train()
        params = dict(model.named_parameters())
        start = {k: p.detach().clone() for k, p in params.items()}
        clip_c = self.clipping_norm_at(ctx.server_round)
        std = spec.noise_stddev(clip_c)
        per_round = spec.rounds_per_server_round
        denom = spec.normalizer  # public, the same for every client
        epoch_cache: dict[int, np.ndarray] = {}
        examples = 0
        draws = 0
        for i in range(per_round):
            t = (ctx.server_round - 1) * per_round + i
            eta = step_size(self.lr_schedule, self.lr, t, self.lr_tau, self.lr_period)
            idx = torch.from_numpy(self._round_indices(t, n, ctx, data.partition_id, epoch_cache))
            examples += int(idx.numel())
            x, y = data.x[idx].to(ctx.device), data.y[idx].to(ctx.device)
            u = self.clipped_sum(model, x, y, eta, clip_c)
            noisy = self.noisy(u, std, clip_c, ctx)
            draws += 1
            with torch.no_grad():
                for k, v in noisy.items():
                    params[k].sub_(eta * (v / denom))
        update = {k: (p.detach() - start[k]).cpu() for k, p in params.items()}
        return update, {
            "local_rounds": float(per_round),
            "noise_draws": float(draws),
            "examples": float(examples),
            "clipping_norm": clip_c,
        }


@dataclass(frozen=True)
class IndividualClippingDPSGD(GeneralizedDPSGD):
    """Classic DP-SGD inside Algorithm 1 (``client=individual_clipping``): ``m`` groups of
    ``s = 1`` record, one gradient each, clipped per sample, with subsampling; the noise
    ``N(0, (2 C σ)^2)`` on the sum, divided by the public ``m``.

    ``sampler=poisson`` switches to Poisson sampling at ``privacy.sample_rate`` (every record
    of the client) with noise ``N(0, (C σ)^2)``, the sum divided by ``m = num_groups`` (the
    public expected batch size, never the client's data size), and the Poisson-subsampled
    Gaussian analysis. Only the defaults differ from :class:`GeneralizedDPSGD`.
    """

    sampler: SamplerKind = SamplerKind.SUBSAMPLE
    num_groups: int = 64
    group_size: int = 1
    lr: float = 0.5
