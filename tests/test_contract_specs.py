"""Every privacy family's spec runs the same contract
(:class:`tests.contracts.PrivacySpecContract`): payload round trip, config schema, calibration
to a new spec, summary, refusals, degraded and local rounds never cheaper, the CLI building the
same events."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from fedpriv.accounting.dpsgd import DPSGDSpec
from fedpriv.accounting.skellam import SkellamSpec
from fedpriv.common.errors import ConfigError
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


class TestSkellamSpec(PrivacySpecContract):
    spec_class = SkellamSpec
    bad_noise = 0.0  # no non-private Skellam run: the scale follows the noise

    def make_spec(self) -> Any:
        return SkellamSpec(
            noise_multiplier=1.2,
            sample_rate=0.1,
            steps=3,
            num_clients=4,
            normalizer=10.0,
            bits=20,
            num_params=1000,
            local_samples=500,
        )

    def cli_params(self, spec: Any) -> dict[str, str]:
        return {
            "noise_multiplier": str(spec.noise_multiplier),
            "sample_rate": str(spec.sample_rate),
            "steps": str(spec.steps),
            "num_clients": str(spec.num_clients),
            "target_delta": str(spec.target_delta),
            "bits": str(spec.bits),
            "num_params": str(spec.num_params),
            "local_samples": str(spec.local_samples),
        }

    def test_refuses_a_negative_noise_too(self) -> None:
        with pytest.raises(ConfigError, match="^privacy.noise_multiplier=-1.0"):
            dataclasses.replace(self.make_spec(), noise_multiplier=-1.0)

    def test_the_events_come_from_the_mechanism_that_draws_the_noise(self) -> None:
        spec = self.make_spec()
        ((event, count),) = spec.round_events()
        m = spec.mechanism
        assert count == spec.steps and event.sample_rate == spec.sample_rate
        assert (event.mu, event.l2_sensitivity) == (m.mu, m.l2_sensitivity)
        assert m.mu == (m.scale * 1.2 * spec.max_grad_norm) ** 2 / 2
        assert m.required_bits <= spec.bits
