"""Client-level DP-FedAvg: a whole client's data is the privacy unit.

Each participating client trains locally (any local optimizer, ``local_epochs`` epochs of
shuffled batches of ``batch_size``), clips its whole model delta to the round's clip norm C
(one L2 norm over all parameters) and sends it; the sum over the cohort gets Gaussian noise
N(0, (σ_Δ C)²), added by the trusted aggregator (``noise_placement=server``, drawn in
:meth:`ClientLevelDPFedAvg.release`) or split into per-client shares N(0, (σ_Δ C)² / m)
over the nominal cohort m (``noise_placement=clients``). Client weights never enter: every
client's clipped delta counts once, and the server divides by the public expected cohort size.

Adaptive clipping (``target_unclipped_quantile`` γ set): each client also sends
``b − 1/2`` (``b = 1`` if its delta was not clipped); the server releases the noisy fraction
``b̃ = (Σ (b − 1/2) + N(0, σ_b²)) / m + 1/2`` and sets ``C ← C · exp(−η_C (b̃ − γ))`` for the
next round (geometric update, ``clip_learning_rate`` η_C). Both releases are accounted as one
Gaussian mechanism of the configured ``privacy.noise_multiplier`` z (σ_Δ follows from z and
``privacy.count_noise_multiplier`` σ_b:
:class:`fedpriv.accounting.client_level.spec.ClientLevelSpec`).

References
----------
McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private Recurrent Language Models"
(arXiv:1710.06963), Alg. 1; Andrew, Thakkar, McMahan, Ramaswamy, "Differentially Private
Learning with Adaptive Clipping" (arXiv:1905.03871), Alg. 1, Sec. 3.1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, ClassVar, Self

import numpy as np
import torch
from torch import nn

from fedpriv.accounting.client_level.spec import ClientLevelSpec
from fedpriv.accounting.core.privacy_spec import PrivacySpec
from fedpriv.common.errors import check
from fedpriv.common.validate import check_finite, parse_enum
from fedpriv.data.augment import augment_views, check_augmult, check_images, view_draws, views_key
from fedpriv.data.client_data import ClientData
from fedpriv.mechanisms.client_sampling import CohortSampler
from fedpriv.mechanisms.lattice_gaussian import add_lattice_gaussian, lattice_step
from fedpriv.mechanisms.noise import add_gaussian_noise, server_generator
from fedpriv.run.algorithm import ClientAlgorithm, PrivacyUnit, TrainContext, check_spec
from fedpriv.run.plan import RunPlan
from fedpriv.run.setup import run_dataset

#: Update entry carrying ``b − 1/2`` (adaptive clipping); stripped by :meth:`release`.
UNCLIPPED_KEY = "fedpriv.unclipped"


class NoisePlacement(StrEnum):
    """Who draws the Gaussian noise of the sum."""

    SERVER = "server"  # the trusted aggregator, once per round
    CLIENTS = "clients"  # each client a share, sized by the nominal cohort


class LocalOptimizer(StrEnum):
    """The clients' local optimizer (torch.optim)."""

    SGD = "sgd"
    ADAM = "adam"


@dataclass(frozen=True)
class ClientLevelDPFedAvg(ClientAlgorithm):
    """Client-level DP-FedAvg (see the module docstring).

    Parameters
    ----------
    local_epochs : int
        Passes over the client's data per round, >= 1.
    batch_size : int
        Local batch size, >= 1 (the last batch of an epoch may be smaller).
    lr : float
        Local step size > 0.
    momentum : float
        SGD momentum in [0, 1) (``optimizer=sgd``).
    augmult : int
        K >= 0 crop-and-flip views of each record in every local batch (0: none); the loss is
        the mean over the records' views (:mod:`fedpriv.data.augment`). Local training only:
        the whole delta is clipped after it, so the accounting is unchanged.
    optimizer : {"sgd", "adam"}
        Local optimizer (post-processing: only the clipped delta leaves the client).
    noise_placement : {"server", "clients"}
        The trusted aggregator adds the noise, or each client adds its share (``clients``
        needs a known cohort size: ``client_sampling`` all or fixed_size).
    target_unclipped_quantile : float, optional
        γ in (0, 1): turns adaptive clipping on (``privacy.count_noise_multiplier`` needed).
    clip_learning_rate : float
        η_C > 0 of the geometric clip-norm update.
    privacy : ClientLevelSpec
        The run's privacy spec (``privacy=client_level``); the algorithm binds the lattice flag
        (``secure_mode`` with the trusted aggregator's noise) and, in :meth:`for_run`, the
        run's cohort sampler and the noise shares (the nominal cohort m with
        ``noise_placement=clients``).
    seed : int
        The run's seed (the trusted aggregator's noise stream), bound by :meth:`for_run`.

    Raises
    ------
    ConfigError
        For a field out of range, a quantile outside (0, 1), adaptive clipping without
        ``privacy.count_noise_multiplier`` (or the count noise without the quantile), client
        noise shares with a cohort of varying size or with ``privacy.secure_mode``.
    """

    spec_type: ClassVar[type[PrivacySpec]] = ClientLevelSpec
    privacy_unit: ClassVar[PrivacyUnit] = PrivacyUnit.CLIENT
    bound_fields: ClassVar[tuple[str, ...]] = ("seed",)

    local_epochs: int = 1
    batch_size: int = 10
    lr: float = 0.1
    momentum: float = 0.0
    augmult: int = 0
    optimizer: LocalOptimizer = LocalOptimizer.SGD
    noise_placement: NoisePlacement = NoisePlacement.SERVER
    target_unclipped_quantile: float | None = None
    clip_learning_rate: float = 0.2
    privacy: ClientLevelSpec = field(default_factory=ClientLevelSpec)
    seed: int = 0

    def __post_init__(self) -> None:
        for name, v in (("local_epochs", self.local_epochs), ("batch_size", self.batch_size)):
            check(isinstance(v, int) and v >= 1, f"client.{name}", v, "must be an integer >= 1")
        check(check_finite("client.lr", self.lr) > 0, "client.lr", self.lr, "must be > 0")
        mom = check_finite("client.momentum", self.momentum)
        check(0 <= mom < 1, "client.momentum", self.momentum, "must be in [0, 1)")
        check_augmult(self.augmult)
        set_ = object.__setattr__
        set_(self, "optimizer", parse_enum(LocalOptimizer, "client.optimizer", self.optimizer))
        placement = parse_enum(NoisePlacement, "client.noise_placement", self.noise_placement)
        set_(self, "noise_placement", placement)
        check_spec(self, self.spec_type)
        self._check_adaptive()
        check(
            not (self.privacy.secure_mode and placement is NoisePlacement.CLIENTS),
            "client.noise_placement",
            placement.value,
            "with privacy.secure_mode=true must be server (the trusted aggregator draws discrete "
            "Gaussian noise); for noise drawn on the clients use client=client_level_skellam",
        )
        lattice = self.privacy.secure_mode and not self.shares and not self.integer_updates
        set_(self, "privacy", self.privacy.bound(lattice_noise=lattice))
        if self.privacy.cohort is not None:
            self.check_cohort(self.privacy.cohort)

    def _check_adaptive(self) -> None:
        gamma, sb = self.target_unclipped_quantile, self.privacy.count_noise_multiplier
        if gamma is not None:
            g = check_finite("client.target_unclipped_quantile", gamma, "must be in (0, 1)")
            check(0 < g < 1, "client.target_unclipped_quantile", gamma, "must be in (0, 1)")
            eta = check_finite("client.clip_learning_rate", self.clip_learning_rate)
            check(eta > 0, "client.clip_learning_rate", self.clip_learning_rate, "must be > 0")
        noisy = not self.privacy.non_private  # a z to calibrate will be > 0
        check(
            not (gamma is not None and sb is None and noisy),
            "privacy.count_noise_multiplier",
            sb,
            "must be set with client.target_unclipped_quantile (adaptive clipping releases a "
            "noisy count; Andrew et al. suggest expected cohort size / 20)",
        )
        check(
            sb is None or gamma is not None,
            "privacy.count_noise_multiplier",
            sb,
            "needs client.target_unclipped_quantile (it is the noise of adaptive clipping)",
        )

    def check_cohort(self, cohort: CohortSampler) -> None:
        """Refuse a cohort sampling the algorithm cannot run (client noise shares need a
        cohort of known size).

        Raises
        ------
        ConfigError
            Naming ``client.noise_placement``.
        """
        check(
            not self.shares or not cohort.varies,
            "client.noise_placement",
            self.noise_placement.value,
            f"needs a cohort of known size (client_sampling={cohort.client_sampling} "
            "varies): use client.noise_placement=server or client_sampling=fixed_size",
        )

    # ---- binding and the capabilities --------------------------------------------------
    def for_run(self, plan: RunPlan) -> Self:
        """Bind the run's cohort sampler and the noise shares into the spec, and the seed."""
        cohort = plan.cohort
        self.check_cohort(cohort)
        check_images(self.augmult, run_dataset(plan).input_shape)
        shares = cohort.nominal_size if self.shares else None
        spec = self.privacy.bound(cohort=cohort, noise_shares=shares)
        return replace(self, privacy=spec, seed=plan.seed)

    @property
    def lattice_noise(self) -> bool:
        """``privacy.secure_mode``: the trusted aggregator's noise is lattice discrete Gaussian
        (:mod:`fedpriv.mechanisms.lattice_gaussian`), safe against floating-point attacks."""
        return self.privacy.lattice_noise

    @property
    def hardened_noise(self) -> bool:  # type: ignore[override]
        return self.lattice_noise

    @property
    def adaptive_clipping(self) -> bool:
        return self.target_unclipped_quantile is not None

    @property
    def normalizer(self) -> float:
        """The public divisor of the sum: the expected cohort size."""
        return float(self.privacy.bound_cohort.expected_size)

    @property
    def shares(self) -> bool:
        """Each client draws its share of the noise (``noise_placement=clients``)."""
        return self.noise_placement is NoisePlacement.CLIENTS

    def privacy_summary(self) -> dict[str, Any]:
        """The spec's summary, the public normalizer and the placement and adaptive-clipping
        settings (``results.json``)."""
        return {
            **super().privacy_summary(),
            "noise_placement": self.noise_placement.value,
            "target_unclipped_quantile": self.target_unclipped_quantile,
            "clip_learning_rate": self.clip_learning_rate if self.adaptive_clipping else None,
        }

    # ---- the server's side ------------------------------------------------------------
    def initial_round_config(self) -> dict[str, float]:
        return {"clipping_norm": float(self.privacy.clipping_norm)}

    def release(
        self, total: dict[str, Any], server_round: int, round_config: Mapping[str, float]
    ) -> tuple[dict[str, Any], dict[str, float], dict[str, float]]:
        """Add the trusted aggregator's noise (``noise_placement=server``), release the noisy
        unclipped fraction and the next clip norm (adaptive clipping).

        Returns ``(sum of deltas, {"clipping_norm", "unclipped_fraction"}, next config)``.
        """
        spec = self.privacy
        c = float(round_config.get("clipping_norm", spec.clipping_norm))
        deltas = {k: v for k, v in total.items() if k != UNCLIPPED_KEY}
        count = total.get(UNCLIPPED_KEY)
        gen = server_generator(self.seed, server_round, spec.secure_mode)
        sd = spec.update_noise_multiplier * c
        rng = np.random.default_rng()  # OS entropy: used in secure_mode (lattice noise) only
        if self.lattice_noise and sd > 0:
            dim = sum(int(np.size(v)) for v in deltas.values())
            deltas = add_lattice_gaussian(deltas, sd, lattice_step(c, dim), rng)
        elif not self.shares:
            deltas = _noisy(deltas, sd, gen)
        if not self.adaptive_clipping:
            return deltas, {}, dict(round_config)
        figures: dict[str, float] = {"clipping_norm": c}
        centred = float(np.sum(count)) if count is not None else 0.0
        sb = float(spec.count_noise_multiplier or 0.0)
        if self.lattice_noise and sb > 0:
            noisy = add_lattice_gaussian({"b": np.array(centred)}, sb, lattice_step(0.5, 1), rng)
            centred = float(noisy["b"])
        elif not self.shares:
            centred += float(torch.randn((), generator=gen, dtype=torch.float64)) * sb
        fraction = centred / self.normalizer + 0.5
        gamma = float(self.target_unclipped_quantile)  # type: ignore[arg-type]
        nxt = c * math.exp(-self.clip_learning_rate * (fraction - gamma))
        figures["unclipped_fraction"] = fraction
        return deltas, figures, {**round_config, "clipping_norm": nxt}

    # ---- the client's side -------------------------------------------------------------
    def train(
        self, model: nn.Module, data: ClientData, ctx: TrainContext
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        spec = self.privacy
        c = float(ctx.round_config.get("clipping_norm", spec.clipping_norm))
        update, metrics = self.clipped_delta(model, data, ctx, c)
        m = spec.noise_shares
        if m is not None:
            share = spec.update_noise_multiplier * c / math.sqrt(m)
            update = add_gaussian_noise(update, share, ctx.generator)
            metrics["noise_draws"] = 1.0
        if self.adaptive_clipping:
            b = torch.tensor([float(metrics["clipped"] == 0) - 0.5], dtype=torch.float32)
            if m is not None:
                sb = float(spec.count_noise_multiplier or 0.0) / math.sqrt(m)
                b = add_gaussian_noise({"b": b}, sb, ctx.generator)["b"]
            update[UNCLIPPED_KEY] = b
        return update, metrics

    def clipped_delta(
        self, model: nn.Module, data: ClientData, ctx: TrainContext, clipping_norm: float
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """Local training, then the whole delta clipped to L2 ``clipping_norm`` (CPU tensors,
        the model's trainable parameter shapes) and the diagnostics (no noise drawn yet)."""
        c = clipping_norm
        params = {k: p for k, p in model.named_parameters() if p.requires_grad}
        start = {k: p.detach().clone() for k, p in params.items()}
        steps = self._local_training(model, list(params.values()), data, ctx)
        with torch.no_grad():
            delta = {k: (p.detach() - start[k]) for k, p in params.items()}
            norm = math.sqrt(sum(float((d.double() ** 2).sum()) for d in delta.values()))
            # 1 - 2^-20 below c/norm: the float32 product never exceeds C (the accounted bound)
            scale = 1.0 if norm <= c else c / norm * (1.0 - 2.0**-20)
            update = {k: (d * scale).cpu() for k, d in delta.items()}
        metrics = {
            "steps": float(steps),
            "examples": float(len(data)),
            "update_norm": norm,
            "clipped": float(norm > c),
            "noise_draws": 0.0,
        }
        return update, metrics

    def _local_training(
        self, model: nn.Module, params: list[nn.Parameter], data: ClientData, ctx: TrainContext
    ) -> int:
        """``local_epochs`` epochs of shuffled mini-batches (mean cross-entropy); steps taken."""
        if self.optimizer is LocalOptimizer.ADAM:
            opt: torch.optim.Optimizer = torch.optim.Adam(params, lr=self.lr)
        else:
            opt = torch.optim.SGD(params, lr=self.lr, momentum=self.momentum)
        n, steps = len(data), 0
        key = views_key(ctx.rng) if self.augmult else None  # the views' own streams
        model.train()
        for _ in range(self.local_epochs):
            order = torch.from_numpy(ctx.rng.permutation(n))
            for lo in range(0, n, self.batch_size):
                idx = order[lo : lo + self.batch_size]
                x, y = data.x[idx].to(ctx.device), data.y[idx].to(ctx.device)
                if key is not None:
                    draws = view_draws(key, steps, idx.numpy(), self.augmult)
                    x = augment_views(x, *draws).flatten(0, 1)
                    y = y.repeat_interleave(self.augmult)
                opt.zero_grad(set_to_none=True)
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                steps += 1
        return steps


def _noisy(
    deltas: dict[str, Any], stddev: float, generator: torch.Generator
) -> dict[str, np.ndarray]:
    """``deltas`` (numpy) plus N(0, stddev²) per coordinate, in sorted key order."""
    tensors = {k: torch.from_numpy(np.asarray(deltas[k], dtype=np.float32)) for k in sorted(deltas)}
    return {k: v.numpy() for k, v in add_gaussian_noise(tensors, stddev, generator).items()}
