"""Client-level DP-FedAvg with integer Skellam noise shares, for Flower's real SecAgg+.

As :class:`clients.client_level_dpfedavg.ClientLevelDPFedAvg`, but each client encodes its
clipped delta (L2 ≤ C, flattened) as integers (scale s, optional randomized Hadamard rotation,
conditional randomized rounding so the rounded vector's L2 norm is ≤ Δ2) and adds its share
Sk(μ/m) of the Skellam noise, μ = (s σ C)² / 2; its message is the residues modulo ``2**bits``,
what SecAgg+ sums. The sum over the m clients carries Sk(μ): one Skellam release per round in
which a client (the privacy unit) contributes ONE rounded vector (RDP: Agarwal, Kairouz, Liu,
"The Skellam Mechanism for Differentially Private Federated Learning", arXiv:2110.04995, Thm
3.5). The scale, mechanism and events come from the run's
:class:`fedpriv.accounting.client_level.skellam_shares.ClientLevelSkellamSpec`, whose Skellam part
is the
same :class:`fedpriv.accounting.skellam.SkellamSpec` that ``fedpriv-account skellam`` builds
(``steps=1``, ``sample_rate=1``, ``local_samples=1``, ``max_grad_norm`` = C).

Every client takes part every round (``client_sampling=all``: SecAgg+ keeps one node per
client); fixed clipping only; accountant RDP.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Self

import numpy as np
import torch
from torch import nn

from clients.client_level_dpfedavg import ClientLevelDPFedAvg, NoisePlacement
from clients.skellam_dpsgd import UPDATE_NAME, SkellamMessages, sums_signed
from fedpriv.accounting.client_level.skellam_shares import ClientLevelSkellamSpec
from fedpriv.accounting.core.privacy_spec import PrivacySpec
from fedpriv.common.errors import check
from fedpriv.data.client_data import ClientData
from fedpriv.mechanisms.client_sampling import ClientSampling, CohortSampler
from fedpriv.mechanisms.modular_range import DEFAULT_WRAP_STDDEVS, ScaleRule, SignalGrowth
from fedpriv.mechanisms.skellam_noise import DEFAULT_BETA, SkellamMechanism
from fedpriv.run.algorithm import TrainContext
from fedpriv.run.plan import RunPlan
from fedpriv.run.setup import build_model_for


@dataclass(frozen=True)
class ClientLevelSkellam(SkellamMessages, ClientLevelDPFedAvg):
    """Client-level DP-FedAvg whose noise is integer Skellam shares (SecAgg+-compatible).

    Parameters
    ----------
    bits : int
        Width of the modular secure sum (2..62; must equal ``aggregator.bits``).
    rotation : bool
        Randomized Hadamard rotation before rounding (public seed per round); required by
        ``scale_rule=probabilistic``.
    scale_rule, wrap_stddevs, signal_growth
        How the scale is chosen (as :class:`~clients.skellam_dpsgd.SkellamDPSGD`).
    signed_updates : bool
        Send signed integers (ideal aggregator: wraps are counted); bound by :meth:`for_run`.
    beta : float
        Conditional rounding parameter in [0, 1).
    dropout_tolerance : int
        Clients that may drop out while the survivors' shares still sum to Sk(μ).
    privacy : ClientLevelSkellamSpec
        The run's ``privacy=client_level`` spec extended with the fields above and, by
        :meth:`for_run`, the model dimension.

    Raises
    ------
    ConfigError
        As the parent, and for a sampled cohort, adaptive clipping, σ <= 0 (without
        ``target_epsilon``), ``privacy.accountant`` other than rdp or ``bits`` too small for
        the sum not to wrap.
    """

    spec_type: ClassVar[type[PrivacySpec]] = ClientLevelSkellamSpec
    integer_updates: ClassVar[bool] = True
    hardened_noise: ClassVar[bool] = True  # type: ignore[assignment]

    noise_placement: NoisePlacement = NoisePlacement.CLIENTS
    bound_fields: ClassVar[tuple[str, ...]] = ("signed_updates",)

    bits: int = 32
    rotation: bool = True
    scale_rule: ScaleRule = ScaleRule.PROBABILISTIC
    wrap_stddevs: float = DEFAULT_WRAP_STDDEVS
    signal_growth: SignalGrowth = SignalGrowth.LINEAR
    beta: float = DEFAULT_BETA
    dropout_tolerance: int = 0
    signed_updates: bool = False
    privacy: ClientLevelSkellamSpec = field(default_factory=ClientLevelSkellamSpec)

    def __post_init__(self) -> None:
        check(
            str(self.noise_placement) == "clients",
            "client.noise_placement",
            self.noise_placement,
            "must be clients (Skellam shares are added by the clients)",
        )
        check(
            self.target_unclipped_quantile is None,
            "client.target_unclipped_quantile",
            self.target_unclipped_quantile,
            "must be null: the Skellam scale is fixed by the clip norm (no adaptive clipping)",
        )
        super().__post_init__()
        skellam = {
            "bits": self.bits,
            "rotation": self.rotation,
            "scale_rule": self.scale_rule,
            "wrap_stddevs": self.wrap_stddevs,
            "signal_growth": self.signal_growth,
            "beta": self.beta,
            "dropout_tolerance": self.dropout_tolerance,
        }
        object.__setattr__(self, "privacy", self.privacy.bound(**skellam))

    def check_cohort(self, cohort: CohortSampler) -> None:
        """Every client every round (SecAgg+ keeps one node per client), then the parent's.

        Raises
        ------
        ConfigError
            Naming ``client_sampling``.
        """
        kind = cohort.client_sampling
        check(
            kind is ClientSampling.ALL,
            "client_sampling",
            kind.value,
            "must be all for client=client_level_skellam (SecAgg+ trains every client)",
        )
        super().check_cohort(cohort)

    def for_run(self, plan: RunPlan) -> Self:
        """Bind the participation, the seed, the model dimension and whether the aggregator
        sums signed integers."""
        model = build_model_for(plan)
        dim = sum(p.numel() for p in model.parameters() if p.requires_grad)
        bound = super().for_run(plan)
        return replace(
            bound,
            privacy=bound.privacy.bound(num_params=int(dim)),
            signed_updates=sums_signed(plan),
        )

    @property
    def mechanism(self) -> SkellamMechanism:
        """The clients' (and the decoder's) mechanism, from the spec."""
        return self.privacy.mechanism

    @property
    def update_bits(self) -> int | None:
        return self.bits

    def rotation_seed(self, server_round: int) -> int:
        """Public rotation seed of a round (the same for every client)."""
        return int(np.random.default_rng([0xC11E, server_round]).integers(2**31))

    def train(
        self, model: nn.Module, data: ClientData, ctx: TrainContext
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        delta, metrics = self.clipped_delta(model, data, ctx, self.privacy.clipping_norm)
        flat = torch.cat([v.reshape(-1) for v in delta.values()]).double().numpy()
        signed = self.mechanism.privatize(flat, ctx.rng, self.rotation_seed(ctx.server_round))
        return {UPDATE_NAME: self.message(signed)}, {**metrics, "noise_draws": 1.0}

    def decode_sum(
        self, total: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]], server_round: int
    ) -> dict[str, np.ndarray]:
        """The real sum of the clients' clipped deltas, from the (modular) sum of messages."""
        seed = self.rotation_seed(server_round)
        summed = self.mechanism.decode_sum(total[UPDATE_NAME], seed)
        out, offset = {}, 0
        for name, shape in shapes.items():
            n = int(np.prod(shape))
            out[name] = summed[offset : offset + n].reshape(shape)
            offset += n
        return out

    def release(
        self, total: dict[str, Any], server_round: int, round_config: Mapping[str, float]
    ) -> tuple[dict[str, Any], dict[str, float], dict[str, float]]:
        """Nothing to add: the noise is in the clients' integer shares."""
        return total, {}, dict(round_config)
