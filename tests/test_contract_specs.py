"""Every privacy family's spec runs the same contract
(:class:`tests.contracts.PrivacySpecContract`): payload round trip, config schema, calibration to a new spec, summary, refusals, degraded and
local rounds never cheaper, the CLI building the same events."""

from __future__ import annotations

from typing import Any

from fedpriv.accounting.dpsgd import DPSGDSpec
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
