"""Multi-step local DP-SGD with Skellam noise on integers, for secure aggregation.

The third paper ("On Using Secure Aggregation in Differentially Private Federated Learning
with Multiple Local Steps", Heikkilä, §3-4) with the Skellam mechanism of Agarwal, Kairouz,
Liu 2021 ("The Skellam Mechanism for Differentially Private Federated Learning",
arXiv:2110.04995): at each of the ``steps`` local steps the client clips every per-sample
gradient to C, scales it by ``scale``, rounds it to integers (conditional randomized rounding,
so each sample's contribution has ℓ2 norm ≤ Δ2), sums the rows, adds its share Sk(μ/N) of the noise
and takes a local step with the unscaled result divided by the public ``normalizer`` (the
constant the server also divides the decoded sum by). Its message is the integer sum over the
steps, reduced modulo ``2**bits``: every aggregator (ideal or SecAgg+) sees only integers. The
sum over N clients of each step carries Sk(μ) with μ = (sσC)²/2: one Poisson-subsampled
Skellam release per step (RDP: AKL21 Thm 3.5 + Steinke 2022 subsampling).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from clients.local_dpsgd import LocalDPSGD, summed_cross_entropy
from fedpriv.accounting.core.privacy_spec import PrivacySpec
from fedpriv.accounting.skellam import SkellamSpec
from fedpriv.common.errors import check
from fedpriv.data.augment import Draws, augment_views, view_draws, views_key
from fedpriv.data.client_data import ClientData
from fedpriv.mechanisms.modular_range import DEFAULT_WRAP_STDDEVS, ScaleRule, SignalGrowth
from fedpriv.mechanisms.persample import per_sample_grads
from fedpriv.mechanisms.samplers import PoissonSampler
from fedpriv.mechanisms.skellam_noise import DEFAULT_BETA, SkellamMechanism
from fedpriv.run.aggregation import aggregator_class
from fedpriv.run.algorithm import TrainContext
from fedpriv.run.plan import RunPlan
from fedpriv.run.setup import build_model_for, partitions

#: The update's one array: residues modulo 2**bits, or signed integers (ideal aggregator).
UPDATE_NAME = "skellam_integers"
#: The round's row: coordinates of the true integer sum outside the modular range.
WRAPS_NAME = "wrapped_coordinates"


class SkellamMessages:
    """What a Skellam client sends, and the wrap count of the sum (both Skellam algorithms).

    With an aggregator that sums modulo ``2**bits`` (SecAgg+) a client sends its residues;
    with the ideal aggregator (``signed_updates``, bound by ``for_run``) it sends the signed
    integers themselves, so that the simulated sum is the TRUE integer sum: the server decodes
    it exactly as the modular one and counts the coordinates that wrapped (:meth:`sum_figures`,
    ``wrapped_coordinates`` in ``metrics.csv`` and ``results.json``).
    """

    signed_updates: bool

    @property
    def mechanism(self) -> SkellamMechanism:
        """The run's mechanism (each algorithm's, from its spec)."""
        raise NotImplementedError

    def message(self, signed: np.ndarray) -> torch.Tensor:
        """The client's message from its signed integer total: itself or its residues."""
        return torch.from_numpy(
            signed if self.signed_updates else self.mechanism.to_residues(signed)
        )

    def sum_figures(self, total: dict[str, Any], server_round: int) -> dict[str, float]:
        """``wrapped_coordinates`` of the true sum (signed updates only)."""
        if not self.signed_updates:
            return {}
        return {WRAPS_NAME: float(self.mechanism.wrapped_coordinates(total[UPDATE_NAME]))}


def sums_signed(plan: RunPlan) -> bool:
    """Whether the run's aggregator sums plain integers (not modulo 2**bits)."""
    return not aggregator_class(plan.aggregator).requires_integer_updates


@dataclass(frozen=True)
class SkellamDPSGD(SkellamMessages, LocalDPSGD):
    """Local DP-SGD whose per-step noise is a Skellam share on integers.

    The mechanism, its scale and its events come from ONE
    :class:`~fedpriv.accounting.skellam.SkellamSpec` (``privacy=skellam``), the object
    ``fedpriv-account skellam`` also builds; the client binds its mechanism fields into it,
    and :meth:`privacy_summary` lists the settings that reproduce the run's ε there.

    Parameters
    ----------
    bits : int
        Width of the modular secure sum (2..62; must equal ``aggregator.bits``).
    rotation : bool
        Randomized Hadamard rotation before rounding (seeded per round, public); required by
        ``scale_rule=probabilistic``.
    scale_rule : {"probabilistic", "no_wrap"}
        How the scale is chosen (:mod:`fedpriv.mechanisms.modular_range`): the range holds
        ``wrap_stddevs`` standard deviations of a summed coordinate, or the sum cannot wrap.
    wrap_stddevs : float
        k > 0 of the probabilistic rule (default 3).
    signal_growth : {"linear", "sqrt"}
        The summed signal's norm bound for the probabilistic rule (``linear``: any data).
    beta : float
        Conditional rounding parameter in [0, 1).
    dropout_tolerance : int
        Clients that may drop out while the survivors' shares still sum to Sk(μ).
    num_params : int
        Model dimension; bound by :meth:`for_run` (not a config key).
    local_samples : int
        Most records any client holds (the wrap bound sums at most ``steps * local_samples``
        rounded vectors per message); bound by :meth:`for_run` from the run's partition (not a
        config key).
    signed_updates : bool
        Send signed integers (ideal aggregator: wraps are counted) instead of residues; bound
        by :meth:`for_run` from the aggregator (not a config key).
    normalizer : float, optional
        Public constant B of the local steps AND of the server's decoding (see
        :class:`~clients.local_dpsgd.LocalDPSGD`).
    privacy : SkellamSpec
        The run's privacy spec (``privacy=skellam``); the fields above, ``steps``, the nominal
        cohort and the normalizer are bound into it.
    (and ``steps``, ``lr``, ``momentum`` of :class:`~clients.local_dpsgd.LocalDPSGD`)

    Raises
    ------
    ConfigError
        For out-of-range fields, ``client.momentum`` != 0 (the server decodes the plain sum of
        the steps), or ``bits`` too small for the sum not to wrap.
    """

    spec_type: ClassVar[type[PrivacySpec]] = SkellamSpec
    #: What it sends: residues modulo 2**bits (SecAgg+-compatible).
    integer_updates: ClassVar[bool] = True
    #: Integer Skellam noise: no floating-point attack surface.
    hardened_noise: ClassVar[bool] = True
    #: It is the lattice twin of LocalDPSGD; it needs none.
    lattice_twin: ClassVar[str | None] = None
    bound_fields: ClassVar[tuple[str, ...]] = ("num_params", "local_samples", "signed_updates")

    bits: int = 32
    rotation: bool = True
    scale_rule: ScaleRule = ScaleRule.PROBABILISTIC
    wrap_stddevs: float = DEFAULT_WRAP_STDDEVS
    signal_growth: SignalGrowth = SignalGrowth.LINEAR
    beta: float = DEFAULT_BETA
    dropout_tolerance: int = 0
    num_params: int = 0
    local_samples: int = 1
    signed_updates: bool = False
    privacy: SkellamSpec = field(default_factory=SkellamSpec)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        super().__post_init__()
        check(
            self.momentum == 0,
            "client.momentum",
            self.momentum,
            "must be 0 for skellam_dpsgd (the server decodes the plain sum of the steps)",
        )

    def bound_facts(self) -> dict[str, Any]:
        """The local steps and normalizer, and the mechanism's fields (the spec validates
        them, and ``bits`` against the wrap bound once ``num_params`` is bound)."""
        return {
            **super().bound_facts(),
            "bits": self.bits,
            "rotation": self.rotation,
            "scale_rule": self.scale_rule,
            "wrap_stddevs": self.wrap_stddevs,
            "signal_growth": self.signal_growth,
            "beta": self.beta,
            "dropout_tolerance": self.dropout_tolerance,
            "num_params": self.num_params,
            "local_samples": self.local_samples,
        }

    def for_run(self, plan: RunPlan) -> SkellamDPSGD:
        """Bind the nominal cohort, the public normalizer, the model dimension, the largest
        client's record count (wrap bound) and whether the aggregator sums signed integers."""
        bound = super().for_run(plan)
        model = build_model_for(plan)
        num_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        local_samples = max(1, max(len(idx) for idx in partitions(plan)))
        return replace(
            bound,
            num_params=int(num_params),
            local_samples=local_samples,
            signed_updates=sums_signed(plan),
        )

    @property
    def update_bits(self) -> int:
        """The width of the residues it sends (``aggregator.bits`` must equal it)."""
        return self.bits

    @property
    def mechanism(self) -> SkellamMechanism:
        """The client's (and decoder's) mechanism: largest scale that cannot wrap."""
        return self.privacy.mechanism

    def rotation_seed(self, server_round: int) -> int:
        """Public rotation seed of a round (the same for every client and step)."""
        return int(np.random.default_rng([0x5EC, server_round]).integers(2**31))

    def record_rows(
        self,
        model: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        draws: Draws | None = None,
    ) -> torch.Tensor:
        """Each record's gradient as one float64 row ``(B, dim)``, unclipped (the mechanism
        clips); with ``augmult`` K > 0 the mean of its gradients on K views
        (:func:`augment_views` of ``draws``), as :meth:`LocalDPSGD.clipped_sums` before its
        clip; computed in parts of ``max_physical_batch_size`` records."""
        parts = self.physical_parts(x, y, draws)
        return torch.cat([self.part_record_rows(model, *part) for part in parts])

    def part_record_rows(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, draws: Draws | None
    ) -> torch.Tensor:
        """:meth:`record_rows` of one physical part."""
        k = max(self.augmult, 1)
        if self.augmult:
            check(draws is not None, "client.augmult", k, "needs the views' draws")
            x = augment_views(x, *draws).flatten(0, 1)  # type: ignore[misc]
            y = y.repeat_interleave(k)
        grads = per_sample_grads(model, summed_cross_entropy, x, y)
        rows = torch.cat([g.reshape(g.shape[0], -1) for g in grads.values()], 1).double()
        return rows.reshape(-1, k, rows.shape[1]).mean(1)

    def train(
        self, model: nn.Module, data: ClientData, ctx: TrainContext
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        mech, sampler = self.mechanism, PoissonSampler(self.privacy.sample_rate)
        normalizer = self.bound_normalizer
        check(
            len(data) <= self.local_samples,
            "client.local_samples",
            self.local_samples,
            f"is below this client's {len(data)} records (the sum could wrap)",
        )
        seed = self.rotation_seed(ctx.server_round)
        params = {k: p for k, p in model.named_parameters() if p.requires_grad}
        total = np.zeros(mech.padded_dim, dtype=np.int64)
        key = views_key(ctx.rng) if self.augmult else None  # the views' own streams
        empty = 0
        for t in range(self.steps):
            idx = torch.from_numpy(sampler.sample(len(data), ctx.rng))
            empty += int(idx.numel() == 0)
            rows = np.zeros((0, mech.dim))
            if idx.numel():
                x, y = data.x[idx].to(ctx.device), data.y[idx].to(ctx.device)
                draws = None if key is None else view_draws(key, t, idx.numpy(), self.augmult)
                rows = self.record_rows(model, x, y, draws).cpu().numpy()
            z = mech.privatize(rows, ctx.rng, seed) if len(rows) else mech.noise(ctx.rng)
            total += z
            step = torch.from_numpy(mech.decode_signed(z, seed)).to(ctx.device)
            with torch.no_grad():
                offset = 0
                for p in params.values():
                    n = p.numel()
                    p.sub_(
                        self.lr
                        * step[offset : offset + n].reshape(p.shape).to(p.dtype)
                        / normalizer
                    )
                    offset += n
        metrics = {
            "steps": float(self.steps),
            "noise_draws": float(self.steps),
            "empty_batches": float(empty),
        }
        return {UPDATE_NAME: self.message(total)}, metrics

    def decode_sum(
        self, total: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]], server_round: int
    ) -> dict[str, np.ndarray]:
        """The real sum over clients of their deltas, from the (modular) sum of their messages."""
        summed = self.mechanism.decode_sum(total[UPDATE_NAME], self.rotation_seed(server_round))
        normalizer = self.bound_normalizer  # the constant of every client's local steps
        out, offset = {}, 0
        for name, shape in shapes.items():
            n = int(np.prod(shape))
            out[name] = -self.lr * summed[offset : offset + n].reshape(shape) / normalizer
            offset += n
        return out
