"""Multi-step local DP-SGD with Skellam noise on integers, for secure aggregation.

Third paper (secagg-multiple-local-steps, §3-4) with the Skellam mechanism of Agarwal, Kairouz,
Liu 2021: at each of the ``steps`` local steps the client clips every per-sample gradient to
C, scales it by ``scale``, rounds it to integers (conditional randomized rounding, so each
sample's contribution has ℓ2 norm ≤ Δ2), sums the rows, adds its share Sk(μ/N) of the noise
and takes a local step with the unscaled result. Its message is the integer sum over the
steps, reduced modulo ``2**bits``: every aggregator (ideal or SecAgg+) sees only integers. The
sum over N clients of each step carries Sk(μ) with μ = (sσC)²/2: one Poisson-subsampled
Skellam release per step (RDP: AKL21 Thm 3.5 + Steinke 2022 subsampling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np
import torch
from torch import nn

from clients.base import ClientData, TrainContext
from clients.dpsgd import LocalDPSGD, summed_cross_entropy
from fedpriv.accounting.calibrate import bisect_noise
from fedpriv.accounting.ledger import PrivacyLedger
from fedpriv.accounting.skellam import SkellamEvent
from fedpriv.errors import check
from fedpriv.persample import per_sample_grads
from fedpriv.samplers import PoissonSampler
from fedpriv.skellam import DEFAULT_BETA, SkellamMechanism

UPDATE_NAME = "skellam_residues"


@dataclass(frozen=True)
class SkellamDPSGD(LocalDPSGD):
    """Local DP-SGD whose per-step noise is a Skellam share on integers.

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
    num_params, num_samples : int
        Model dimension and total training samples; filled in by :meth:`bind`.

    Raises
    ------
    ConfigError
        For out-of-range fields, or ``bits`` too small for the sum not to wrap.
    """

    integer_updates = True  # what it sends: residues modulo 2**bits (SecAgg+-compatible)
    hardened_noise = True  # integer Skellam noise: no floating-point attack surface

    bits: int = 32
    rotation: bool = False
    beta: float = DEFAULT_BETA
    dropout_tolerance: int = 0
    num_params: int = 0
    num_samples: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        calibrating = not self.noise_multiplier and self.privacy.get("target_epsilon") is not None
        check(
            self.noise_multiplier > 0 or calibrating,
            "privacy.noise_multiplier",
            self.noise_multiplier,
            "must be > 0 for the Skellam mechanism",
        )
        if self.num_params and not calibrating:
            self.mechanism  # noqa: B018 - validates bits now, before training

    def for_run(self, cfg: dict[str, Any]) -> SkellamDPSGD:
        """Bind the model dimension and the total training samples (for the wrap bound)."""
        from fedpriv.setup import build_model_for, run_dataset

        num_params = sum(p.numel() for p in build_model_for(cfg).parameters() if p.requires_grad)
        return replace(self, num_params=int(num_params), num_samples=len(run_dataset(cfg).y_train))

    @cached_property
    def mechanism(self) -> SkellamMechanism:
        """The client's (and decoder's) mechanism: largest scale that cannot wrap."""
        check(
            self.num_params > 0, "client.num_params", self.num_params, "must be set (call for_run)"
        )
        per_client = math.ceil(self.num_samples / self.num_clients)
        return SkellamMechanism.from_noise_multiplier(
            self.noise_multiplier,
            bits=self.bits,
            clipping_norm=self.max_grad_norm,
            num_clients=self.num_clients,
            dim=self.num_params,
            rotation=self.rotation,
            honest_but_curious=bool(self.privacy.get("honest_but_curious")),
            dropout_tolerance=self.dropout_tolerance,
            beta=self.beta,
            steps=self.steps,
            max_summands=self.steps * max(per_client, 1),
        )

    def step_event(self, noise_multiplier: float | None = None) -> SkellamEvent:
        """The Skellam release of one step's sum over the clients (integer units)."""
        mech = (
            self.mechanism
            if noise_multiplier is None
            else replace(
                self, privacy={**self.privacy, "noise_multiplier": noise_multiplier}
            ).mechanism
        )
        return SkellamEvent(
            mu=mech.mu,
            l1_sensitivity=mech.l1_sensitivity,
            l2_sensitivity=mech.l2_sensitivity,
            sample_rate=self.sample_rate,
        )

    def privacy_summary(self) -> dict[str, Any]:
        """The mechanism's integer-unit parameters (pass ``scale``/``beta`` to ``fedpriv-account
        secagg-dpsgd mechanism=skellam`` to recompute ε)."""
        m = self.mechanism
        return {
            "mechanism": "skellam",
            "bits": m.bits,
            "scale": m.scale,
            "mu": m.mu,
            "beta": m.beta,
            "num_params": m.dim,
            "l1_sensitivity": m.l1_sensitivity,
            "l2_sensitivity": m.l2_sensitivity,
        }

    def round_events(self) -> list[tuple[Any, int]]:
        return [(self.step_event(), self.steps)]

    def degraded_round_events(self, contributors: int) -> list[tuple[Any, int]]:
        """Events of a round whose sum holds only ``contributors`` clients' shares."""
        hbc = int(bool(self.privacy.get("honest_but_curious")))
        mu = min(self.mechanism.mu, self.mechanism.mu_per_client * (contributors - hbc))
        check(mu > 0, "contributors", contributors, "leave no trusted noise in the sum")
        return [(replace(self.step_event(), mu=mu), self.steps)]

    def local_events(self) -> list[tuple[Any, int]]:
        own = self.step_event()
        return [(replace(own, mu=self.mechanism.mu_per_client), self.steps)]

    def calibrated(
        self, target_epsilon: float, target_delta: float, num_rounds: int
    ) -> SkellamDPSGD:
        def epsilon_of(sigma: float) -> float:
            ledger = PrivacyLedger(
                accountant="rdp", conversion=self.privacy.get("conversion", "default")
            )
            ledger.record(self.step_event(sigma), self.steps * num_rounds)
            return ledger.get_epsilon(target_delta)

        sigma = bisect_noise(epsilon_of, target_epsilon, field="privacy.noise_multiplier")
        return replace(
            self, privacy={**self.privacy, "noise_multiplier": sigma, "target_epsilon": None}
        )

    def rotation_seed(self, server_round: int) -> int:
        """Public rotation seed of a round (the same for every client and step)."""
        return int(np.random.default_rng([0x5EC, server_round]).integers(2**31))

    def train(
        self, model: nn.Module, data: ClientData, ctx: TrainContext
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        mech, sampler = self.mechanism, PoissonSampler(self.sample_rate)
        seed = self.rotation_seed(ctx.server_round)
        params = {k: p for k, p in model.named_parameters() if p.requires_grad}
        expected_batch = max(self.sample_rate * len(data), 1.0)
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
                        / expected_batch
                    )
                    offset += n
        residues = torch.from_numpy(mech.to_residues(total))
        return {UPDATE_NAME: residues}, {"steps": float(self.steps), "empty_batches": float(empty)}

    def decode_sum(
        self, total: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]], server_round: int
    ) -> dict[str, np.ndarray]:
        """The real sum over clients of their deltas, from the modular sum of their residues."""
        summed = self.mechanism.decode_sum(total[UPDATE_NAME], self.rotation_seed(server_round))
        expected_batch = max(self.sample_rate * self.num_samples / self.num_clients, 1.0)
        out, offset = {}, 0
        for name, shape in shapes.items():
            n = int(np.prod(shape))
            out[name] = -self.lr * summed[offset : offset + n].reshape(shape) / expected_batch
            offset += n
        return out
