"""Multi-step local DP-SGD with local Gaussian noise whose SUM over clients is private.

Third paper ("On Using Secure Aggregation in Differentially Private Federated Learning with
Multiple Local Steps", Heikkilä; Alg. 1, Theorems 4.6-4.7): each of the ``steps`` local steps
draws a Poisson batch of the client's data at ``sample_rate``, clips per-sample gradients to
``max_grad_norm`` C, sums them, adds N(0, (σC)²/m) noise (σ = ``noise_multiplier``, m =
``num_clients``, or N−1 if ``honest_but_curious``), divides by the PUBLIC ``normalizer`` B
(the same for every client) and takes an SGD step. The client sends its model delta; the
aggregator reveals only the sum over clients, whose per-step noise is N(0, (σC)²)/B while
any record moves it by at most C/B: one Poisson-subsampled Gaussian with multiplier σ per
step on the union of the clients' data. The analysis lives in
:class:`fedpriv.accounting.dpsgd.DPSGDSpec`, which this client builds once and delegates to.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Self

import torch
from torch import nn

from fedpriv.accounting.core.privacy_spec import PrivacySpec
from fedpriv.accounting.dpsgd import DPSGDSpec
from fedpriv.common.errors import check
from fedpriv.common.validate import check_finite
from fedpriv.data.augment import (
    Draws,
    augment_views,
    check_augmult,
    check_images,
    view_draws,
    views_key,
)
from fedpriv.data.client_data import ClientData
from fedpriv.mechanisms.ghost import refuse_cross_sample
from fedpriv.mechanisms.noise import add_gaussian_noise
from fedpriv.mechanisms.persample import clipped_grad_sum, clipped_group_grad_sum, trainable
from fedpriv.mechanisms.samplers import PoissonSampler
from fedpriv.mechanisms.vmap_clients import cohort_clipped_grad_sums, padded_batches
from fedpriv.run.algorithm import ClientAlgorithm, TrainContext, check_spec
from fedpriv.run.plan import RunPlan
from fedpriv.run.setup import run_dataset


def nominal_expected_batch(plan: RunPlan, sample_rate: float) -> float:
    """The public normalizer of a run: ``max(q * n_train / N, 1)``.

    ``n_train`` is the number of training records of the run's dataset as configured (its
    nominal size, known from the config like Opacus's expected batch size), ``q`` the
    per-record ``sample_rate`` and ``N`` = ``num_clients``: the expected batch of an average
    client. It is the same for every client and never depends on a client's own data.
    """
    n_train = len(run_dataset(plan).y_train)
    return max(sample_rate * n_train / plan.num_clients, 1.0)


def summed_cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy summed over the batch (per-sample losses add up)."""
    return nn.functional.cross_entropy(out, y, reduction="sum")


@dataclass(frozen=True)
class LocalDPSGD(ClientAlgorithm):
    """Local DP-SGD, ``steps`` steps per round, noise shared across the cohort.

    Parameters
    ----------
    steps : int
        Local DP-SGD steps per server round (S), >= 1.
    lr : float
        Step size γ; the step is ``θ ← θ − γ (g + ξ) / B`` with B = :attr:`normalizer`.
    momentum : float
        Heavy-ball momentum in [0, 1) (post-processing of the noisy steps).
    augmult : int
        K >= 0 augmented views per record, their gradients averaged before the clip (0: none).
        Augmentation multiplicity (De et al. 2022, arXiv:2204.13650; :mod:`fedpriv.data.augment`):
        a record still adds at most C to a step's sum, so the accounting is unchanged.
    max_physical_batch_size : int, optional
        P >= 1 records per forward and backward pass (Opacus's name): a step's Poisson batch
        goes through the model P records at a time and the parts' clipped sums are added, so
        the step's sum, its noise and the accounting are the same and memory holds P records
        (times K views). ``None`` (the default): the whole batch at once.
    normalizer : float, optional
        B > 0, the public constant that divides every client's noisy gradient sum. ``None``
        (the default): the run's nominal expected batch ``max(q n_train / N, 1)``, bound by
        :meth:`for_run` from the configured dataset (:func:`nominal_expected_batch`).
    privacy : DPSGDSpec
        The run's privacy spec (``privacy=dpsgd``); :meth:`for_run` binds ``steps``, the
        nominal cohort (the clients whose noise shares add up) and the normalizer.

    Raises
    ------
    ConfigError
        For out-of-range or non-finite fields (see :class:`~fedpriv.accounting.dpsgd.DPSGDSpec`),
        and ``privacy.sample_rate=0`` (the spec takes it for ``fedpriv-account``; a run refuses it).
    """

    spec_type: ClassVar[type[PrivacySpec]] = DPSGDSpec
    #: With ``privacy.secure_mode=true``: Skellam noise on integers (a fine grid at 32 bits),
    #: whose sum over the clients is again Skellam; its message is the integer sum of the steps.
    lattice_twin: ClassVar[str | None] = "clients.skellam_dpsgd.SkellamDPSGD"

    steps: int = 10
    lr: float = 2.0
    momentum: float = 0.0
    augmult: int = 0
    max_physical_batch_size: int | None = None
    normalizer: float | None = None  # type: ignore[assignment]
    privacy: DPSGDSpec = field(default_factory=DPSGDSpec)

    def __post_init__(self) -> None:
        check(
            isinstance(self.steps, int) and self.steps >= 1,
            "client.steps",
            self.steps,
            "must be an integer >= 1",
        )
        lr = check_finite("client.lr", self.lr)
        check(lr > 0, "client.lr", self.lr, "must be a finite number > 0")
        mom = check_finite("client.momentum", self.momentum)
        check(0 <= mom < 1, "client.momentum", self.momentum, "must be in [0, 1)")
        check_augmult(self.augmult)
        size = self.max_physical_batch_size
        check(
            size is None or (isinstance(size, int) and not isinstance(size, bool) and size >= 1),
            "client.max_physical_batch_size",
            size,
            "must be an integer >= 1 (records per forward pass) or null (the whole batch)",
        )
        check_spec(self, self.spec_type)
        check(  # fedpriv-account takes q = 0 (epsilon 0); a run at q = 0 would train nothing
            self.privacy.sample_rate > 0,
            "privacy.sample_rate",
            self.privacy.sample_rate,
            "must be in (0, 1] for a run (at 0 no step would use any record)",
        )
        object.__setattr__(self, "privacy", self.privacy.bound(**self.bound_facts()))

    def bound_facts(self) -> dict[str, Any]:
        """What the client binds into its spec: its local steps, and the normalizer when it
        is configured (or bound by :meth:`for_run`)."""
        facts: dict[str, Any] = {"steps": self.steps}
        if self.normalizer is not None:
            facts["normalizer"] = self.normalizer
        return facts

    def for_run(self, plan: RunPlan) -> Self:
        """Bind the nominal cohort and the public normalizer (nominal expected batch when
        ``normalizer`` is not configured)."""
        check_images(self.augmult, run_dataset(plan).input_shape)
        normalizer = self.normalizer
        if normalizer is None:
            normalizer = nominal_expected_batch(plan, self.privacy.sample_rate)
        spec = self.privacy.bound(num_clients=plan.cohort.nominal_size, normalizer=normalizer)
        return replace(self, normalizer=normalizer, privacy=spec)

    @property
    def bound_normalizer(self) -> float:
        """The spec's normalizer as a float; refuses an unbound algorithm (never a data size)."""
        check(
            self.privacy.normalizer is not None,
            "client.normalizer",
            None,
            "must be set (give client.normalizer or bind the algorithm with for_run(plan))",
        )
        return float(self.privacy.normalizer)  # type: ignore[arg-type]

    @property
    def local_noise_stddev(self) -> float:
        """Each client's noise std per step: σ C / √(noise shares), from the spec."""
        return self.privacy.local_noise_stddev

    def noise(
        self, sums: dict[str, torch.Tensor], generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """One step's clipped gradient sums (parameter shapes) plus this client's noise
        share, N(0, local_noise_stddev²) per coordinate."""
        return add_gaussian_noise(sums, self.local_noise_stddev, generator)

    def train(
        self, model: nn.Module, data: ClientData, ctx: TrainContext
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        normalizer = self.bound_normalizer
        sampler = PoissonSampler(self.privacy.sample_rate)
        start = {k: p.detach().clone() for k, p in model.named_parameters()}
        params = dict(model.named_parameters())
        velocity = {k: torch.zeros_like(p) for k, p in params.items()}
        key = views_key(ctx.rng) if self.augmult else None  # the views' own streams
        empty = 0
        total = 0
        for step in range(self.steps):
            idx = torch.from_numpy(sampler.sample(len(data), ctx.rng))
            empty += int(idx.numel() == 0)
            total += int(idx.numel())
            x, y = data.x[idx].to(ctx.device), data.y[idx].to(ctx.device)
            draws = None if key is None else view_draws(key, step, idx.numpy(), self.augmult)
            noisy = self.noise(self.clipped_sums(model, x, y, draws), ctx.generator)
            with torch.no_grad():
                for k, g in noisy.items():
                    velocity[k].mul_(self.momentum).add_(g / normalizer)
                    params[k].sub_(self.lr * velocity[k])
        update = {k: (p.detach() - start[k]).cpu() for k, p in params.items()}
        metrics = {
            "steps": float(self.steps),
            "noise_draws": float(self.steps),
            "empty_batches": float(empty),
            "examples": float(total),
        }
        return update, metrics

    def clipped_sums(
        self,
        model: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        draws: Draws | None = None,
    ) -> dict[str, torch.Tensor]:
        """One step's sum over the batch ``x`` ``(B, ...)``, ``y`` ``(B,)`` of per-record
        gradients clipped to C. With ``augmult`` K > 0 a record's gradient is the mean of its
        gradients on the K views ``draws`` gives (:func:`view_draws`, :func:`augment_views`),
        clipped after averaging: each record still adds a vector of norm at most C. The batch
        goes through the model in parts of ``max_physical_batch_size`` records."""
        total: dict[str, torch.Tensor] = {}
        for part in self.physical_parts(x, y, draws):
            sums = self.part_clipped_sums(model, *part)
            total = sums if not total else {k: total[k].add_(v) for k, v in sums.items()}
        return total

    def physical_parts(
        self, x: torch.Tensor, y: torch.Tensor, draws: Draws | None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, Draws | None]]:
        """The batch in consecutive parts of at most ``max_physical_batch_size`` records, each
        with its records' view draws (one part when the size is ``None``)."""
        size = self.max_physical_batch_size or max(x.shape[0], 1)
        k = max(self.augmult, 1)
        for lo in range(0, max(x.shape[0], 1), size):
            hi = lo + size
            part = None if draws is None else (draws[0][lo * k : hi * k], draws[1][lo * k : hi * k])
            yield x[lo:hi], y[lo:hi], part

    def part_clipped_sums(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, draws: Draws | None
    ) -> dict[str, torch.Tensor]:
        """:meth:`clipped_sums` of one physical part."""
        clip = self.privacy.max_grad_norm
        if self.augmult == 0 or x.shape[0] == 0:
            return clipped_grad_sum(model, summed_cross_entropy, x, y, clip)[0]
        check(draws is not None, "client.augmult", self.augmult, "needs the views' draws")
        refuse_cross_sample(model)
        views = augment_views(x, *draws)  # type: ignore[misc]
        labels = y[:, None].expand(-1, self.augmult)
        sums = clipped_group_grad_sum(model, summed_cross_entropy, views, labels, clip)
        assert sums is not None  # None only with BatchNorm, refused above
        return sums

    def trains_cohorts(self) -> bool:
        """Vectorized over clients only without augmentation (:meth:`train_cohort` draws no
        views) and without physical batches (it holds every client's whole batch)."""
        plain = self.augmult == 0 and self.max_physical_batch_size is None
        return plain and super().trains_cohorts()

    def train_cohort(
        self, model: nn.Module, datas: Sequence[ClientData], ctxs: Sequence[TrainContext]
    ) -> tuple[dict[str, torch.Tensor], list[dict[str, float]]]:
        """:meth:`train` for clients that all start from ``model``, vectorized over them.

        Returns the updates stacked over the clients (``(k, *param.shape)`` per parameter,
        row ``j`` client ``j``'s) and each client's metrics.

        Client ``j`` draws its batches from ``ctxs[j].rng`` and its noise from
        ``ctxs[j].generator`` in the same order as :meth:`train`, and every update step is the
        same elementwise arithmetic, so each result equals ``train(model, datas[j], ctxs[j])``
        up to the float rounding of the batched per-sample gradients
        (:func:`fedpriv.mechanisms.vmap_clients.cohort_clipped_grad_sums`). ``model`` is not
        modified.
        """
        normalizer = self.bound_normalizer
        sampler = PoissonSampler(self.privacy.sample_rate)
        device = ctxs[0].device
        k = len(datas)
        params = {
            n: p.detach().unsqueeze(0).repeat(k, *[1] * p.dim())
            for n, p in trainable(model).items()
        }
        start = {n: p.clone() for n, p in params.items()}
        velocity = {n: torch.zeros_like(p) for n, p in params.items()}
        empty, total = [0] * k, [0] * k
        for _ in range(self.steps):
            idx = [torch.from_numpy(sampler.sample(len(d), c.rng)) for d, c in zip(datas, ctxs)]
            for j, i in enumerate(idx):
                empty[j] += int(i.numel() == 0)
                total[j] += int(i.numel())
            if max(int(i.numel()) for i in idx) == 0:
                sums = {n: torch.zeros_like(p) for n, p in params.items()}
            else:
                x, y, mask = padded_batches(datas, idx, device)
                sums = cohort_clipped_grad_sums(
                    model, summed_cross_entropy, params, x, y, mask, self.privacy.max_grad_norm
                )
            with torch.no_grad():
                noisy = sums if self.local_noise_stddev == 0 else self._noisy_rows(sums, ctxs)
                for n in params:  # elementwise, so each row is exactly train()'s arithmetic
                    velocity[n].mul_(self.momentum).add_(noisy[n] / normalizer)
                    params[n].sub_(self.lr * velocity[n])
        steps = float(self.steps)
        metrics = [
            {"steps": steps, "noise_draws": steps, "empty_batches": float(e), "examples": float(t)}
            for e, t in zip(empty, total)
        ]
        return {n: (params[n] - start[n]).cpu() for n in params}, metrics

    def _noisy_rows(
        self, sums: dict[str, torch.Tensor], ctxs: Sequence[TrainContext]
    ) -> dict[str, torch.Tensor]:
        """Each client's row of ``sums`` plus its own noise, drawn from its own generator in
        :meth:`train`'s order; stacked back to ``(k, ...)``."""
        rows = [
            add_gaussian_noise(
                {n: g[j] for n, g in sums.items()}, self.local_noise_stddev, c.generator
            )
            for j, c in enumerate(ctxs)
        ]
        return {n: torch.stack([r[n] for r in rows]) for n in sums}
