"""Client-level DP-FTRL: DP-FedAvg's clients, the server's noise correlated across rounds.

Each participating client trains locally and clips its whole delta to C, as in
:class:`clients.client_level_dpfedavg.ClientLevelDPFedAvg` (any local optimizer). The trusted
aggregator adds to round t's sum ``z · C · s₁ · w_t``, where ``w_t`` is row t of the
factorization's streaming noise ``M Z`` (:class:`fedpriv.accounting.ftrl.spec.FTRLSpec`, the same
spec that states the events). The fresh draws of round t come from the run's server noise
generator for (seed, t), in the same order and dtype as DP-FedAvg's, so the identity
factorization adds exactly DP-FedAvg's noise. The stream is a deterministic function of the
seed and the round: a resumed run replays it from round 1 (bit for bit). The server enforces
the participation pattern (:mod:`fedpriv.mechanisms.enforced_cohort`); the mean divides by the
public expected size of the enforced cohort. A server optimizer (``strategy.server_optimizer``
fedavgm: momentum, as the papers) post-processes the noisy mean.

References
----------
Kairouz et al. 2021, arXiv:2103.00039, Alg. 1 (DP-FTRL); Choquette-Choo et al. 2023,
arXiv:2211.06530 and arXiv:2306.08153 (MF-DP-FTRL with momentum, BandMF); McMahan et al. 2018,
arXiv:1710.06963 (client-level DP-FedAvg).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, ClassVar, Self

import numpy as np
import torch

from clients.client_level_dpfedavg import ClientLevelDPFedAvg, NoisePlacement
from fedpriv.accounting.core.privacy_spec import PrivacySpec
from fedpriv.accounting.ftrl.spec import FTRLSpec
from fedpriv.common.errors import check
from fedpriv.mechanisms.correlated_noise import NoiseStream
from fedpriv.mechanisms.enforced_cohort import AvailabilityTrace, EnforcedCohort
from fedpriv.mechanisms.noise import server_generator
from fedpriv.run.algorithm import check_spec
from fedpriv.run.plan import RunPlan


@dataclass
class _ServerState:
    """The server's noise stream, the next round it will produce, and the public normalizer
    once computed (a dry run of the enforcement: computed once, read every round)."""

    stream: NoiseStream | None = None
    next_round: int = 1
    normalizer: float | None = None


@dataclass(frozen=True)
class ClientLevelFTRL(ClientLevelDPFedAvg):
    """Client-level DP-FTRL (see the module docstring).

    Parameters
    ----------
    privacy : FTRLSpec
        The run's ``privacy=ftrl`` spec; :meth:`for_run` binds the cohort and ``num_rounds``.
    availability : AvailabilityTrace or None
        The run's simulated device availability (bound by :meth:`for_run`): the normalizer's
        dry run of the enforcement filters by it as the server does.
    (and the local-training fields of the parent)

    Raises
    ------
    ConfigError
        As the parent, and for adaptive clipping (its noisy count is not accounted by the
        DP-FTRL analysis) or ``noise_placement=clients``.
    """

    spec_type: ClassVar[type[PrivacySpec]] = FTRLSpec
    bound_fields: ClassVar[tuple[str, ...]] = ("seed", "availability")

    privacy: FTRLSpec = field(default_factory=FTRLSpec)  # type: ignore[assignment]
    availability: AvailabilityTrace | None = None
    _noise: _ServerState = field(
        default_factory=_ServerState, init=False, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        check_spec(self, FTRLSpec)
        check(
            self.target_unclipped_quantile is None,
            "client.target_unclipped_quantile",
            self.target_unclipped_quantile,
            "must be null with privacy=ftrl: adaptive clipping's extra release is not "
            "accounted by the DP-FTRL analysis (use fixed clipping)",
        )
        check(
            str(self.noise_placement) == NoisePlacement.SERVER.value,
            "client.noise_placement",
            self.noise_placement,
            "must be server with privacy=ftrl (the correlated noise is one stream)",
        )
        super().__post_init__()

    def for_run(self, plan: RunPlan) -> Self:
        """Bind the cohort, the seed and ``num_rounds`` into the spec, and the availability."""
        bound = super().for_run(plan)
        spec = bound.privacy.bound(num_rounds=plan.num_rounds)
        return replace(bound, privacy=spec, availability=plan.availability)

    @property
    def normalizer(self) -> float:
        """The public divisor: the expected size of the ENFORCED cohort over the run (a dry
        run of the enforcement, data-independent), at least 1."""
        state = self._noise
        if state.normalizer is None:
            spec = self.privacy
            cohort = spec.bound_cohort
            cohorts = EnforcedCohort(
                cohort, spec.pattern, availability=self.availability, seed=cohort.seed
            )
            state.normalizer = max(1.0, cohorts.expected_cohort_size(spec.rounds))
        return state.normalizer

    def release(
        self, total: dict[str, Any], server_round: int, round_config: Mapping[str, float]
    ) -> tuple[dict[str, Any], dict[str, float], dict[str, float]]:
        """Add round ``server_round``'s correlated noise to the sum of clipped deltas."""
        spec = self.privacy
        sd = spec.noise_stddev if not spec.non_private else 0.0
        keys = sorted(total)
        tensors = {k: torch.from_numpy(np.asarray(total[k], dtype=np.float32)) for k in keys}
        if sd == 0:
            return {k: v.numpy() for k, v in tensors.items()}, {}, dict(round_config)
        shapes = {k: tuple(tensors[k].shape) for k in keys}
        w = self.noise_at(server_round, shapes)
        out, lo = {}, 0
        for k in keys:
            size = tensors[k].numel()
            noise = torch.from_numpy(w[lo : lo + size].reshape(shapes[k])).to(torch.float32)
            out[k] = noise.mul_(sd).add_(tensors[k]).numpy()
            lo += size
        return out, {}, dict(round_config)

    def noise_at(self, server_round: int, shapes: Mapping[str, tuple[int, ...]]) -> np.ndarray:
        """``w_t`` (flat float64, keys in sorted order) for ``t = server_round``: the stream
        stepped (replayed from round 1 when needed) with each round's seeded draws."""
        state, dim = self._noise, sum(int(np.prod(s)) for s in shapes.values())
        if state.stream is None or state.next_round > server_round:
            state.stream, state.next_round = self.privacy.strategy.stream(dim), 1
        w = np.zeros(dim)
        while state.next_round <= server_round:
            gen = server_generator(self.seed, state.next_round)
            w = state.stream.step(partial(_draw, shapes, gen))
            state.next_round += 1
        return w


def _draw(shapes: Mapping[str, tuple[int, ...]], generator: torch.Generator) -> np.ndarray:
    """One fresh N(0, 1) vector: float32 draws per key in sorted order (as DP-FedAvg's)."""
    parts = [
        torch.randn(torch.Size(shapes[k]), generator=generator, dtype=torch.float32).reshape(-1)
        for k in sorted(shapes)
    ]
    return torch.cat(parts).to(torch.float64).numpy()
