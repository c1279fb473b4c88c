"""Every privacy family's spec runs the same contract
(:class:`tests.contracts.PrivacySpecContract`): payload round trip, config schema,
calibration to a new spec, summary, refusals, degraded and local rounds never cheaper, the
CLI building the same events."""

from __future__ import annotations

import math
from typing import Any

import pytest

from fedpriv.accounting.client_level import ClientLevelSpec
from fedpriv.accounting.client_skellam import ClientLevelSkellamSpec
from fedpriv.accounting.dpsgd import DPSGDSpec
from fedpriv.accounting.vocabulary import Accountant
from fedpriv.mechanisms.client_sampling import ClientSampling, CohortSampler
from tests.contracts import PrivacySpecContract


class TestDPSGDSpec(PrivacySpecContract):
    spec_class = DPSGDSpec

    def make_spec(self) -> Any:
        return DPSGDSpec(
            noise_multiplier=1.2, sample_rate=0.1, steps=3, num_clients=4, normalizer=10.0
        )

    def cli_params(self, spec: Any) -> dict[str, str]:
        return {
            "noise_multiplier": str(spec.noise_multiplier),
            "sample_rate": str(spec.sample_rate),
            "steps": str(spec.steps),
            "target_delta": str(spec.target_delta),
        }


class TestClientLevelSpec(PrivacySpecContract):
    """Client-level DP-FedAvg, Poisson cohort, the trusted aggregator's noise."""

    spec_class = ClientLevelSpec

    def make_spec(self) -> Any:
        cohort = CohortSampler(100, ClientSampling.POISSON, client_sample_rate=0.1, seed=1)
        return ClientLevelSpec(noise_multiplier=1.0, clipping_norm=0.5, cohort=cohort)

    def cli_params(self, spec: Any) -> dict[str, str]:
        c = spec.cohort
        return {
            "noise_multiplier": str(spec.noise_multiplier),
            "num_clients": str(c.num_clients),
            "client_sampling": c.client_sampling.value,
            "client_sample_rate": str(c.client_sample_rate),
            "target_delta": str(spec.target_delta),
        }


class TestClientLevelSpecSharesAdaptive(TestClientLevelSpec):
    """Fixed-size cohort (replace-one, RDP), client noise shares, adaptive clipping's count
    noise: a degraded round holds fewer shares."""

    def make_spec(self) -> Any:
        cohort = CohortSampler(100, ClientSampling.FIXED_SIZE, num_sampled_clients=10)
        return ClientLevelSpec(
            noise_multiplier=1.0,
            count_noise_multiplier=10.0,  # 2 σ_b above the z of every calibration here
            cohort=cohort,
            noise_shares=10,
            accountant=Accountant.RDP,
        )

    def cli_params(self, spec: Any) -> dict[str, str]:
        return {
            "noise_multiplier": str(spec.noise_multiplier),
            "num_clients": "100",
            "client_sampling": "fixed_size",
            "num_sampled_clients": "10",
            "count_noise_multiplier": str(spec.count_noise_multiplier),
            "target_delta": str(spec.target_delta),
        }

    def test_degraded_round_events_hold_the_contributors_shares(self) -> None:
        spec = self.make_spec()
        ((event, _),) = spec.degraded_round_events(4)
        assert event.event.noise_multiplier == pytest.approx(math.sqrt(4 / 10) / 2, rel=1e-12)
        assert spec.degraded_round_events(12) == spec.round_events()


class TestClientLevelSpecLattice(TestClientLevelSpec):
    """secure_mode: the trusted aggregator's lattice discrete Gaussian (RDP)."""

    def make_spec(self) -> Any:
        cohort = CohortSampler(100, ClientSampling.POISSON, client_sample_rate=0.1)
        return ClientLevelSpec(
            noise_multiplier=1.0,
            cohort=cohort,
            secure_mode=True,
            lattice_noise=True,
            accountant=Accountant.RDP,
        )

    def cli_params(self, spec: Any) -> dict[str, str]:
        return {**super().cli_params(spec), "secure_mode": "true", "accountant": "rdp"}


class TestClientLevelSkellamSpec(PrivacySpecContract):
    """Client-level DP-FedAvg with Skellam shares (client=client_level_skellam), RDP."""

    spec_class = ClientLevelSkellamSpec

    def make_spec(self) -> Any:
        return ClientLevelSkellamSpec(
            noise_multiplier=1.0,
            clipping_norm=0.5,
            cohort=CohortSampler(6),
            noise_shares=6,
            num_params=7850,
            accountant=Accountant.RDP,
        )
