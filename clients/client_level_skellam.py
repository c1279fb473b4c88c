"""Client-level DP-FedAvg with integer Skellam noise shares, for Flower's real SecAgg+.

As :class:`clients.client_level_dpfedavg.ClientLevelDPFedAvg`, but each client encodes its
clipped delta (L2 ≤ C, flattened) as integers (scale s, optional randomized Hadamard rotation,
conditional randomized rounding so the rounded vector's L2 norm is ≤ Δ2) and adds its share
Sk(μ/m) of the Skellam noise, μ = (s σ C)² / 2; its message is the residues modulo ``2**bits``,
what SecAgg+ sums. The sum over the m clients carries Sk(μ): one Skellam release per round in
which a client (the privacy unit) contributes ONE rounded vector (RDP: Agarwal, Kairouz, Liu,
"The Skellam Mechanism for Differentially Private Federated Learning", arXiv:2110.04995, Thm
3.5). The scale, mechanism and events come from the same
:class:`fedpriv.accounting.skellam.SkellamSpec` that ``fedpriv-account skellam`` builds
(``steps=1``, ``sample_rate=1``, ``local_samples=1``, ``max_grad_norm`` = C).

Every client takes part every round (``client_sampling=all``: SecAgg+ keeps one node per
client); fixed clipping only; accountant RDP.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from clients.client_level_dpfedavg import ClientLevelDPFedAvg
from clients.skellam_dpsgd import UPDATE_NAME
from fedpriv.accounting.accountant import AccountingSpec
from fedpriv.accounting.skellam import SkellamSpec
from fedpriv.common.errors import check
from fedpriv.data.client_data import ClientData
from fedpriv.mechanisms.client_sampling import ClientSampling
from fedpriv.mechanisms.skellam_noise import DEFAULT_BETA, SkellamMechanism
from fedpriv.run.algorithm import TrainContext


@dataclass(frozen=True)
class ClientLevelSkellam(ClientLevelDPFedAvg):
    """Client-level DP-FedAvg whose noise is integer Skellam shares (SecAgg+-compatible).

    Parameters
    ----------
    bits : int
        Width of the modular secure sum (2..62; must equal ``aggregator.bits``).
    rotation : bool
        Randomized Hadamard rotation before rounding (public seed per round).
    beta : float
        Conditional rounding parameter in [0, 1).
    dropout_tolerance : int
        Clients that may drop out while the survivors' shares still sum to Sk(μ).
    num_params : int
        Model dimension, bound by :meth:`for_run`.

    Raises
    ------
    ConfigError
        As the parent, and for a sampled cohort, adaptive clipping, σ <= 0 (without
        ``target_epsilon``) or ``bits`` too small for the sum not to wrap.
    """

    integer_updates: ClassVar[bool] = True  # type: ignore[misc]
    hardened_noise: ClassVar[bool] = True  # type: ignore[misc]

    noise_placement: str = "clients"
    bits: int = 32
    rotation: bool = False
    beta: float = DEFAULT_BETA
    dropout_tolerance: int = 0
    num_params: int = 0

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
        if self.cohort is not None:
            kind = self.cohort.client_sampling
            check(
                kind is ClientSampling.ALL,
                "client_sampling",
                kind.value,
                "must be all for client=client_level_skellam (SecAgg+ trains every client)",
            )
        super().__post_init__()
        if self.num_params and self.skellam.noise_multiplier:
            self.mechanism  # noqa: B018 - validates bits now, before training

    def for_run(self, cfg: dict[str, Any]) -> ClientLevelSkellam:
        """Bind the participation, seed and model dimension."""
        from fedpriv.run.setup import build_model_for

        model = build_model_for(cfg)
        dim = sum(p.numel() for p in model.parameters() if p.requires_grad)
        bound = super().for_run(cfg)
        return replace(self, cohort=bound.cohort, seed=bound.seed, num_params=int(dim))

    @cached_property
    def skellam(self) -> SkellamSpec:
        """THE Skellam spec of the run: one rounded vector per client per round."""
        p = self.privacy
        accounting = AccountingSpec.from_privacy({**p, "accountant": "rdp"})
        noise = p.get("noise_multiplier")
        return SkellamSpec(
            noise_multiplier=None if noise is None else float(noise),
            target_epsilon=p.get("target_epsilon") if noise is None else None,
            sample_rate=1.0,
            steps=1,
            max_grad_norm=float(p.get("clipping_norm", 1.0)),
            num_clients=self.num_clients,
            normalizer=1.0,
            accountant=accounting.accountant,
            conversion=accounting.conversion,
            target_delta=accounting.target_delta,
            bits=self.bits,
            num_params=self.num_params,
            rotation=self.rotation,
            beta=self.beta,
            dropout_tolerance=self.dropout_tolerance,
            local_samples=1,
        )

    @property
    def mechanism(self) -> SkellamMechanism:
        return self.skellam.mechanism

    def round_events(self) -> list[tuple[Any, int]]:
        return self.skellam.round_events()

    def degraded_round_events(self, contributors: int) -> list[tuple[Any, int]]:
        return self.skellam.degraded_round_events(contributors)

    def privacy_summary(self) -> dict[str, Any]:
        own = super().privacy_summary()
        return {**self.skellam.summary(), **own, "mechanism": "skellam"}

    def calibrated(
        self, target_epsilon: float, target_delta: float, num_rounds: int
    ) -> ClientLevelSkellam:
        """Smallest σ whose Skellam ε (RDP) after ``num_rounds`` rounds meets the target."""
        probe = self.skellam.with_noise(self.skellam.noise_multiplier or 1.0)
        spec = replace(probe, target_delta=target_delta).calibrated(target_epsilon, num_rounds)
        privacy = {**self.privacy, "noise_multiplier": spec.noise_multiplier}
        return replace(self, privacy={**privacy, "target_epsilon": None})

    def rotation_seed(self, server_round: int) -> int:
        """Public rotation seed of a round (the same for every client)."""
        return int(np.random.default_rng([0xC11E, server_round]).integers(2**31))

    def train(
        self, model: nn.Module, data: ClientData, ctx: TrainContext
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        delta, metrics = self.clipped_delta(model, data, ctx, self.skellam.max_grad_norm)
        flat = torch.cat([v.reshape(-1) for v in delta.values()]).double().numpy()
        residues = self.mechanism.encode(flat, ctx.rng, self.rotation_seed(ctx.server_round))
        return {UPDATE_NAME: torch.from_numpy(residues)}, {**metrics, "noise_draws": 1.0}

    def decode_sum(
        self, total: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]], server_round: int
    ) -> dict[str, np.ndarray]:
        """The real sum of the clients' clipped deltas, from the modular sum of residues."""
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
