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

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np
import torch
from torch import nn

from clients.local_dpsgd import LocalDPSGD, summed_cross_entropy
from clients.local_dpsgd import nominal_expected_batch as nominal
from fedpriv.accounting.dpsgd import DPSGDSpec
from fedpriv.accounting.skellam import SkellamEvent, SkellamSpec
from fedpriv.accounting.accountant import AccountingSpec
from fedpriv.common.errors import check
from fedpriv.mechanisms.persample import per_sample_grads
from fedpriv.mechanisms.samplers import PoissonSampler
from fedpriv.mechanisms.skellam_noise import DEFAULT_BETA, SkellamMechanism
from fedpriv.data.client_data import ClientData
from fedpriv.run.algorithm import TrainContext

UPDATE_NAME = "skellam_residues"


@dataclass(frozen=True)
class SkellamDPSGD(LocalDPSGD):
    """Local DP-SGD whose per-step noise is a Skellam share on integers.

    The mechanism, its scale and its events come from ONE
    :class:`~fedpriv.accounting.skellam.SkellamSpec`, the object ``fedpriv-account skellam``
    also builds; :meth:`privacy_summary` lists the settings that reproduce the run's ε there.

    Parameters
    ----------
    bits : int
        Width of the modular secure sum (2..62).
    rotation : bool
        Randomized Hadamard rotation before rounding (seeded per round, public).
    beta : float
        Conditional rounding parameter in [0, 1).
    dropout_tolerance : int
        Clients that may drop out while the survivors' shares still sum to Sk(μ).
    num_params : int
        Model dimension; filled in by :meth:`for_run`.
    local_samples : int
        Most records any client holds (the wrap bound sums at most ``steps * local_samples``
        rounded vectors per message); filled in by :meth:`for_run` from the run's partition.
    normalizer : float, optional
        Public constant B of the local steps AND of the server's decoding (see
        :class:`~clients.local_dpsgd.LocalDPSGD`).

    Raises
    ------
    ConfigError
        For out-of-range fields, ``client.momentum`` != 0 (the server decodes the plain sum of
        the steps), or ``bits`` too small for the sum not to wrap.
    """

    integer_updates = True  # what it sends: residues modulo 2**bits (SecAgg+-compatible)
    hardened_noise = True  # integer Skellam noise: no floating-point attack surface

    bits: int = 32
    rotation: bool = False
    beta: float = DEFAULT_BETA
    dropout_tolerance: int = 0
    num_params: int = 0
    local_samples: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        check(
            self.momentum == 0,
            "client.momentum",
            self.momentum,
            "must be 0 for skellam_dpsgd (the server decodes the plain sum of the steps)",
        )
        calibrating = not self.noise_multiplier and self.privacy.get("target_epsilon") is not None
        check(
            self.noise_multiplier > 0 or calibrating,
            "privacy.noise_multiplier",
            self.noise_multiplier,
            "must be > 0 for the Skellam mechanism",
        )
        if self.num_params and not calibrating:
            self.mechanism  # noqa: B018 - validates bits now, before training

    @cached_property
    def spec(self) -> SkellamSpec:  # type: ignore[override]
        """THE Skellam spec of the run (scale, mechanism, events), built once."""
        base = DPSGDSpec.from_privacy(self.privacy, steps=self.steps, num_clients=self.num_clients)
        return SkellamSpec(
            noise_multiplier=base.noise_multiplier,
            sample_rate=base.sample_rate,
            steps=self.steps,
            max_grad_norm=base.max_grad_norm,
            num_clients=self.num_clients,
            honest_but_curious=base.honest_but_curious,
            normalizer=self.normalizer,
            accounting=AccountingSpec.from_privacy({"accountant": "rdp", **self.privacy}),
            bits=self.bits,
            num_params=self.num_params,
            rotation=self.rotation,
            beta=self.beta,
            dropout_tolerance=self.dropout_tolerance,
            local_samples=self.local_samples,
        )

    def for_run(self, cfg: dict[str, Any]) -> SkellamDPSGD:
        """Bind the model dimension, the largest client's record count (wrap bound) and the
        public normalizer."""
        from fedpriv.run.setup import build_model_for, partitions

        num_params = sum(p.numel() for p in build_model_for(cfg).parameters() if p.requires_grad)
        return replace(
            self,
            normalizer=self.normalizer if self.normalizer is not None else nominal(cfg),
            num_params=int(num_params),
            local_samples=max(1, max(len(idx) for idx in partitions(cfg))),
        )

    @property
    def mechanism(self) -> SkellamMechanism:
        """The client's (and decoder's) mechanism: largest scale that cannot wrap."""
        return self.spec.mechanism

    def step_event(self) -> SkellamEvent:
        """The Skellam release of one step's sum over the clients (integer units)."""
        return self.spec.step_event()

    def privacy_summary(self) -> dict[str, Any]:
        """The spec's parameters: with ``noise_multiplier``, ``steps``, ``num_rounds``,
        ``sample_rate`` and ``num_clients`` they are the keys of ``fedpriv-account skellam``
        that reproduce the run's ε."""
        return {**self.spec.summary(), "normalizer": self.bound_normalizer}

    def calibrated(
        self, target_epsilon: float, target_delta: float, num_rounds: int
    ) -> SkellamDPSGD:
        """Smallest σ whose ε (RDP, the run's ``privacy.conversion``) meets the target."""
        spec = replace(
            self.spec,
            noise_multiplier=self.noise_multiplier or 1.0,
            accounting=AccountingSpec.from_privacy(
                {"accountant": "rdp", **self.privacy}, target_delta=target_delta
            ),
        ).calibrated(target_epsilon, num_rounds)
        return replace(
            self,
            privacy={
                **self.privacy,
                "noise_multiplier": spec.noise_multiplier,
                "target_epsilon": None,
            },
        )

    def rotation_seed(self, server_round: int) -> int:
        """Public rotation seed of a round (the same for every client and step)."""
        return int(np.random.default_rng([0x5EC, server_round]).integers(2**31))

    def train(
        self, model: nn.Module, data: ClientData, ctx: TrainContext
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        mech, sampler = self.mechanism, PoissonSampler(self.sample_rate)
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
        empty = 0
        for _ in range(self.steps):
            idx = torch.from_numpy(sampler.sample(len(data), ctx.rng))
            empty += int(idx.numel() == 0)
            rows = np.zeros((0, mech.dim))
            if idx.numel():
                grads = per_sample_grads(
                    model,
                    summed_cross_entropy,
                    data.x[idx].to(ctx.device),
                    data.y[idx].to(ctx.device),
                )
                rows = (
                    torch.cat([g.reshape(g.shape[0], -1) for g in grads.values()], 1)
                    .double()
                    .cpu()
                    .numpy()
                )
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
        residues = torch.from_numpy(mech.to_residues(total))
        metrics = {
            "steps": float(self.steps),
            "noise_draws": float(self.steps),
            "empty_batches": float(empty),
        }
        return {UPDATE_NAME: residues}, metrics

    def decode_sum(
        self, total: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]], server_round: int
    ) -> dict[str, np.ndarray]:
        """The real sum over clients of their deltas, from the modular sum of their residues."""
        summed = self.mechanism.decode_sum(total[UPDATE_NAME], self.rotation_seed(server_round))
        normalizer = self.bound_normalizer  # the constant of every client's local steps
        out, offset = {}, 0
        for name, shape in shapes.items():
            n = int(np.prod(shape))
            out[name] = -self.lr * summed[offset : offset + n].reshape(shape) / normalizer
            offset += n
        return out
