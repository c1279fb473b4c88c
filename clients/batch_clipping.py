"""Generalized DP-SGD (the first paper's Algorithm 1): shuffling, batch clipping, any optimizer.

Per local round the client draws ``S_b`` (``m`` groups of ``s`` records) with
``Sample_{s,m}``; each group runs the local optimizer ``A`` from the same round model ``w``
and yields ``a_h = (w - w_end) / eta``; ``U = sum_h [a_h]_C``; the client adds
``N(0, (2 C sigma)^2 I)`` and applies ``U_bar = (U + noise) / m`` to its local model
(``w <- w - eta U_bar``). It sends the sum of its ``U_bar`` steps (post-processing of
releases that are each private on their own, so no secure aggregation is assumed).

``s = 1`` with ``A`` = one gradient is classic DP-SGD ("individual clipping"); ``m = 1`` is
batch clipping. With the Poisson sampler (individual clipping only) the noise is
``N(0, (C sigma)^2 I)``, ``U_bar = (U + noise) / (q N)`` and the standard Poisson-subsampled
Gaussian analysis (add/remove relation) applies; shuffling and subsampling are accounted by
the exact f-DP mixture of :mod:`fedpriv.accounting.batch_clipping` (replace-one relation).

References
----------
van Dijk, Nguyen, Nguyen, Phan, "Generalizing DP-SGD with Shuffling and Batch Clipping"
(../shared/papers/batch-clipping-shuffling.txt): Algorithm 1, Sec. 3, Sec. 5, Table 1;
PRIVACY-SPEC Sec. 1. Abadi et al. 2016 (DP-SGD).
"""

from __future__ import annotations

import importlib
import inspect
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from clients.base import ClientAlgorithm, ClientData, TrainContext
from clients.dpsgd import summed_cross_entropy
from fedpriv.accounting import batch_clipping as bc
from fedpriv.accounting import gdp
from fedpriv.accounting.calibrate import calibrate_noise_multiplier as calibrate_poisson
from fedpriv.accounting.dpsgd import poisson_gaussian_event
from fedpriv.clipping import clip_tensors
from fedpriv.errors import ConfigError, check, unknown_key
from fedpriv.ghost import batch_clipped_grad, refuse_cross_sample
from fedpriv.noise import add_gaussian_noise
from fedpriv.persample import clipped_grad_sum
from fedpriv.samplers import PoissonSampler, ShuffleSampler, SubsampleSampler

SAMPLERS = ("shuffle", "subsample", "poisson")
GROUP_UPDATES = ("minibatch", "sequential")
LR_SCHEDULES = ("constant", "diminishing", "cosine")
ANALYSES = ("auto", "batch-clipping", "poisson-gaussian")
Update = dict[str, torch.Tensor]


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


def _plain(node: Any) -> dict[str, Any]:
    """A plain dict from a dict or an OmegaConf node."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]
    return dict(node)


@dataclass(frozen=True)
class GeneralizedDPSGD(ClientAlgorithm):
    """Algorithm 1 of the batch-clipping paper as a fedpriv client algorithm.

    Parameters
    ----------
    sampler : {"shuffle", "subsample", "poisson"}
        ``Sample_{s,m}``; ``poisson`` (rate ``privacy.sample_rate``) only with ``group_size=1``.
    num_groups, group_size : int
        ``m`` groups of ``s`` records per local round (``m s <= N``).
    local_rounds, epochs : int, optional
        Local rounds per server round, or whole epochs (``N // (m s)`` rounds each; for
        Poisson ``round(1/q)``); give exactly one.
    group_update : {"minibatch", "sequential"}
        ``A``: one optimizer step on the group's mean loss at ``w`` (for plain SGD: one
        mini-batch gradient), or one step per record in sequence (classical SGD).
    optimizer : dict
        ``{"_target_": "torch.optim.SGD" | "torch.optim.Adam" | ..., **kwargs}`` (lr is set
        per round from the schedule).
    lr, lr_schedule, lr_tau, lr_period :
        ``eta0``; schedule constant | diminishing (``eta0/(1+t/tau)``) | cosine (period
        ``lr_period`` local rounds).
    clipping_norms : list of float, optional
        ``C`` per server round (last value repeated); default ``privacy.max_grad_norm``.
    num_samples : int, optional
        ``N`` used by every client (the smallest partition; set by :meth:`for_run`).
    analysis : {"auto", "batch-clipping", "poisson-gaussian"}
        Refused unless it matches the sampler.
    seed : int
        The run's seed (shuffled epochs spanning server rounds are derived from it).
    privacy : dict
        The run's privacy group (noise_multiplier σ, max_grad_norm C, sample_rate,
        group_sizes, secure_mode).
    num_clients : int
        Number of clients (each client's release is private on its own).

    Raises
    ------
    ConfigError
        On any out-of-range or uncovered setting, naming the field.
    """

    supports_group_privacy = True  # epsilon_g for privacy.group_sizes (null: 1, 2, 4, 8)
    sampler: str = "shuffle"
    num_groups: int = 1
    group_size: int = 64
    local_rounds: int | None = None
    epochs: int | None = 1
    group_update: str = "minibatch"
    optimizer: dict[str, Any] = field(default_factory=lambda: {"_target_": "torch.optim.SGD"})
    lr: float = 0.1
    lr_schedule: str = "constant"
    lr_tau: float = 100.0
    lr_period: int | None = None
    clipping_norms: list[float] | None = None
    num_samples: int | None = None
    analysis: str = "auto"
    seed: int = 0
    privacy: dict[str, Any] = field(default_factory=dict)
    num_clients: int = 1

    def __post_init__(self) -> None:
        check(
            hasattr(self.optimizer, "get") and self.optimizer.get("_target_") is not None,
            "client.optimizer",
            self.optimizer,
            "must be a mapping with _target_ (e.g. {_target_: torch.optim.SGD})",
        )
        if not isinstance(self.optimizer, dict):  # a DictConfig when Hydra runs non-recursively
            object.__setattr__(self, "optimizer", _plain(self.optimizer))
        if self.clipping_norms is not None and not isinstance(self.clipping_norms, list):
            object.__setattr__(self, "clipping_norms", [float(c) for c in self.clipping_norms])
        check(
            self.sampler in SAMPLERS, "client.sampler", self.sampler, f"must be one of {SAMPLERS}"
        )
        for name in ("num_groups", "group_size"):
            v = getattr(self, name)
            check(
                isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                f"client.{name}",
                v,
                "must be an integer >= 1",
            )
        check(
            (self.local_rounds is None) != (self.epochs is None),
            "client.local_rounds",
            self.local_rounds,
            f"and client.epochs={self.epochs!r}: give exactly one",
        )
        if self.epochs is not None:
            check(
                isinstance(self.epochs, int) and self.epochs >= 1,
                "client.epochs",
                self.epochs,
                "must be an integer >= 1",
            )
        if self.local_rounds is not None:
            check(
                isinstance(self.local_rounds, int) and self.local_rounds >= 1,
                "client.local_rounds",
                self.local_rounds,
                "must be an integer >= 1",
            )
        check(
            self.group_update in GROUP_UPDATES,
            "client.group_update",
            self.group_update,
            f"must be one of {GROUP_UPDATES}",
        )
        check(self.lr > 0, "client.lr", self.lr, "must be > 0")
        check_optimizer(self.optimizer, self.lr)
        check(
            self.lr_schedule in LR_SCHEDULES,
            "client.lr_schedule",
            self.lr_schedule,
            f"must be one of {LR_SCHEDULES}",
        )
        check(self.lr_tau > 0, "client.lr_tau", self.lr_tau, "must be > 0")
        if self.lr_schedule == "cosine":
            check(
                isinstance(self.lr_period, int) and self.lr_period >= 1,
                "client.lr_period",
                self.lr_period,
                "must be an integer >= 1 with lr_schedule=cosine",
            )
        if self.clipping_norms is not None:
            check(
                len(self.clipping_norms) >= 1 and all(c > 0 for c in self.clipping_norms),
                "client.clipping_norms",
                self.clipping_norms,
                "must be null or a non-empty list of values > 0",
            )
        check(self.clipping_norm > 0, "privacy.max_grad_norm", self.clipping_norm, "must be > 0")
        check(
            self.noise_multiplier >= 0,
            "privacy.noise_multiplier",
            self.noise_multiplier,
            "must be >= 0",
        )
        check(self.num_clients >= 1, "num_clients", self.num_clients, "must be >= 1")
        for g in self.group_sizes:
            check(
                isinstance(g, int) and g >= 1,
                "privacy.group_sizes",
                list(self.group_sizes),
                "must all be integers >= 1",
            )
        self._check_analysis()
        if self.num_samples is not None:
            self._check_data(self.num_samples)

    def _check_analysis(self) -> None:
        check(
            self.analysis in ANALYSES,
            "client.analysis",
            self.analysis,
            f"must be one of {ANALYSES}",
        )
        if self.sampler == "poisson":
            check(
                self.analysis != "batch-clipping",
                "client.analysis",
                self.analysis,
                "does not cover sampler='poisson' (variable-size batches); use analysis=poisson-gaussian",
            )
            check(
                self.group_size == 1 and self.group_update == "minibatch" and self._plain_sgd,
                "client.group_size",
                self.group_size,
                "must be 1 with sampler=poisson, group_update=minibatch and plain SGD: only individual "
                "clipping has a Poisson analysis (noise N(0,(C sigma)^2))",
            )
        else:
            check(
                self.analysis != "poisson-gaussian",
                "client.analysis",
                self.analysis,
                f"does not cover sampler={self.sampler!r}: the Poisson analysis under-reports epsilon "
                "for shuffled or fixed-size batches; use analysis=batch-clipping",
            )

    def _check_data(self, n: int) -> None:
        check(isinstance(n, int) and n >= 1, "client.num_samples", n, "must be an integer >= 1")
        if self.sampler != "poisson":
            check(
                self.num_groups * self.group_size <= n,
                "client.num_groups",
                self.num_groups,
                f"times client.group_size={self.group_size} must be <= the client's {n} samples",
            )
        for g in self.group_sizes:
            check(
                g <= n,
                "privacy.group_sizes",
                list(self.group_sizes),
                f"must all be <= the client's {n} samples",
            )

    # ------------------------------------------------------------------ derived values
    @property
    def noise_multiplier(self) -> float:
        return float(self.privacy.get("noise_multiplier") or 0.0)

    @property
    def clipping_norm(self) -> float:
        """Default clipping constant C (``privacy.max_grad_norm``)."""
        return float(self.privacy.get("max_grad_norm", 1.0))

    @property
    def sample_rate(self) -> float:
        return float(self.privacy.get("sample_rate", 0.1))

    @property
    def group_sizes(self) -> tuple[int, ...]:
        return tuple(self.privacy.get("group_sizes") or (1, 2, 4, 8))

    @property
    def neighboring_relation(self) -> str:
        """The relation the round events hold for (replace-one except Poisson)."""
        return "add_remove" if self.sampler == "poisson" else "replace_one"

    @property
    def _plain_sgd(self) -> bool:
        return is_plain_sgd(self.optimizer)

    def _n(self) -> int:
        if self.num_samples is None:
            raise ConfigError(
                "client.num_samples", None, "is unknown: build the algorithm with for_run(cfg)"
            )
        return int(self.num_samples)

    @property
    def rounds_per_epoch(self) -> int:
        """``N // (m s)``; for Poisson ``max(1, round(1/q))``."""
        if self.sampler == "poisson":
            return max(1, round(1.0 / self.sample_rate))
        return self._n() // (self.num_groups * self.group_size)

    @property
    def rounds_per_server_round(self) -> int:
        return (
            self.local_rounds
            if self.local_rounds is not None
            else int(self.epochs or 1) * self.rounds_per_epoch
        )

    def noise_stddev(self, clipping_norm: float) -> float:
        """``2 C sigma`` (``C sigma`` for Poisson with individual clipping)."""
        factor = 1.0 if self.sampler == "poisson" else 2.0
        return factor * clipping_norm * self.noise_multiplier

    def clipping_norm_at(self, server_round: int) -> float:
        """C of ``server_round`` (1-based) from ``clipping_norms``, else ``privacy.max_grad_norm``."""
        if not self.clipping_norms:
            return self.clipping_norm
        return float(self.clipping_norms[min(server_round, len(self.clipping_norms)) - 1])

    # ------------------------------------------------------------------ binding to a run
    def for_run(self, cfg: dict[str, Any]) -> GeneralizedDPSGD:
        """Bind to a run: ``N`` = the smallest client partition (each client uses its first
        ``N`` records, so every client runs the same accounted mechanism), the seed, and a
        check that the model has no BatchNorm under individual clipping.

        Raises
        ------
        ConfigError
            If ``m s > N``, a group size exceeds ``N``, or BatchNorm meets individual clipping.
        """
        from fedpriv.setup import build_model_for, partitions

        n = min(len(p) for p in partitions(cfg))
        bound = replace(self, num_samples=n, seed=int(cfg.get("seed", 0)))
        if self.group_size == 1:
            refuse_cross_sample(build_model_for(cfg))
        if (
            bool(self.privacy.get("secure_mode"))
            and self.sampler == "shuffle"
            and bound.rounds_per_server_round % bound.rounds_per_epoch
        ):
            raise ConfigError(
                "client.local_rounds",
                self.local_rounds,
                f"must be a multiple of the {bound.rounds_per_epoch} rounds per epoch with "
                "privacy.secure_mode=true and sampler=shuffle",
            )
        return bound

    # ------------------------------------------------------------------ accounting
    def _event(self, group_privacy: int = 1) -> Any:
        if self.sampler == "poisson":
            return poisson_gaussian_event(self.noise_multiplier, self.sample_rate)
        return bc.BatchClippingEvent(
            self.sampler,
            self._n(),
            self.num_groups,
            self.group_size,
            self.noise_multiplier,
            group_privacy,
        )

    def round_events(self) -> list[tuple[Any, int]]:
        return [(self._event(), self.rounds_per_server_round)]

    def degraded_round_events(self, contributors: int) -> list[tuple[Any, int]]:
        """Each client's release carries its own noise and is private alone, so other clients'
        dropouts weaken nothing: the full round's events (an upper bound for a dropped client)."""
        return self.round_events()

    def privacy_summary(self) -> dict[str, Any]:
        """The accounted mechanism: sampler, sizes, rounds, noise and relation."""
        return {
            "analysis": "poisson-gaussian" if self.sampler == "poisson" else "batch-clipping",
            "sampler": self.sampler,
            "num_samples": self.num_samples,
            "num_groups": self.num_groups,
            "group_size": self.group_size,
            "local_rounds_per_server_round": self.rounds_per_server_round,
            "noise_stddev_per_unit_clipping_norm": self.noise_stddev(1.0),
            "neighboring_relation": self.neighboring_relation,
            "group_sizes": list(self.group_sizes),
        }

    def privacy_report(self, rounds: int, target_delta: float) -> dict[str, float]:
        """ε for each g in ``privacy.group_sizes`` (``epsilon_g{g}``) and the paper's Table 1
        closed form (``epsilon_g{g}_closed``) after ``rounds`` server rounds.

        Poisson sampling reports no group figures (no group analysis implemented).
        """
        if self.sampler == "poisson" or rounds < 1:
            return {}
        count = rounds * self.rounds_per_server_round
        epochs = count / self.rounds_per_epoch
        out: dict[str, float] = {}
        for g in self.group_sizes:
            out[f"epsilon_g{g}"] = self._event(g).epsilon(target_delta, count)
            mu, _ = bc.table1_mu(self.num_groups, self.group_size, epochs, self.noise_multiplier, g)
            out[f"epsilon_g{g}_closed"] = gdp.gdp_epsilon(target_delta, mu)
        return out

    def calibrated(
        self, target_epsilon: float, target_delta: float, num_rounds: int
    ) -> GeneralizedDPSGD:
        count = num_rounds * self.rounds_per_server_round
        if self.sampler == "poisson":
            sigma = calibrate_poisson(
                target_epsilon,
                target_delta,
                self.sample_rate,
                count,
                accountant=self.privacy.get("accountant", "pld"),
            )
        else:
            law = bc.sum_squares_law(
                self.sampler, self._n(), self.num_groups, self.group_size, count
            )
            sigma = bc.calibrate_noise_multiplier(law, target_epsilon, target_delta)
        return replace(
            self, privacy={**self.privacy, "noise_multiplier": sigma, "target_epsilon": None}
        )

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
        if self.sampler == "poisson":
            return PoissonSampler(self.sample_rate).sample(n, ctx.rng).reshape(-1, 1)
        if self.sampler == "subsample":
            return SubsampleSampler(self.num_groups, self.group_size).sample(n, ctx.rng)
        sampler = ShuffleSampler(self.num_groups, self.group_size)
        r = self.rounds_per_epoch
        epoch, b = divmod(t, r)
        if epoch not in epoch_cache:
            aligned = self.rounds_per_server_round % r == 0
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
        """``a_h = (w - w_end) / eta`` of the optimizer run from ``w`` on one group (general path)."""
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
        (``s = 1``) uses :func:`fedpriv.persample.clipped_grad_sum` (classic DP-SGD), ``m = 1``
        uses :func:`fedpriv.ghost.batch_clipped_grad`. ``w`` is left unchanged.
        """
        m, s = x.shape[0], x.shape[1]
        if self.group_update == "minibatch" and self._plain_sgd:
            if s == 1:
                return clipped_grad_sum(
                    model, summed_cross_entropy, x[:, 0], y[:, 0], clipping_norm
                )[0]
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

    def train(
        self, model: nn.Module, data: ClientData, ctx: TrainContext
    ) -> tuple[Update, dict[str, float]]:
        n = self._n()
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
        std = self.noise_stddev(clip_c)
        per_round = self.rounds_per_server_round
        epoch_cache: dict[int, np.ndarray] = {}
        examples = 0
        for i in range(per_round):
            t = (ctx.server_round - 1) * per_round + i
            eta = step_size(self.lr_schedule, self.lr, t, self.lr_tau, self.lr_period)
            idx = torch.from_numpy(self._round_indices(t, n, ctx, data.partition_id, epoch_cache))
            examples += int(idx.numel())
            x, y = data.x[idx].to(ctx.device), data.y[idx].to(ctx.device)
            u = self.clipped_sum(model, x, y, eta, clip_c)
            noisy = add_gaussian_noise(u, std, ctx.generator)
            denom = (
                max(self.sample_rate * n, 1.0)
                if self.sampler == "poisson"
                else float(self.num_groups)
            )
            with torch.no_grad():
                for k, v in noisy.items():
                    params[k].sub_(eta * (v / denom))
        update = {k: (p.detach() - start[k]).cpu() for k, p in params.items()}
        return update, {
            "local_rounds": float(per_round),
            "examples": float(examples),
            "clipping_norm": clip_c,
        }
