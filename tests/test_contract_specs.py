"""Every privacy family's spec runs the same contract
(:class:`tests.contracts.PrivacySpecContract`): payload round trip, config schema, calibration
to a new spec, summary, refusals, degraded and local rounds never cheaper, the CLI building the
same events."""

from __future__ import annotations

from typing import Any

from fedpriv.accounting.batch_clipping import BatchClippingSpec
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


class TestBatchClippingSpec(PrivacySpecContract):
    """Batch clipping with shuffling (the first paper's f-DP mixture, replace-one)."""

    spec_class = BatchClippingSpec

    def make_spec(self) -> Any:
        return BatchClippingSpec(
            noise_multiplier=1.2, num_samples=600, num_groups=1, group_size=50, epochs=1
        )

    def cli_params(self, spec: Any) -> dict[str, str]:
        return {
            "sampling": spec.sampler.value,
            "num_samples": str(spec.num_samples),
            "num_groups": str(spec.num_groups),
            "group_size": str(spec.group_size),
            "epochs": str(spec.epochs),
            "noise_multiplier": str(spec.noise_multiplier),
            "target_delta": str(spec.target_delta),
        }


class TestBatchClippingPoissonSpec(PrivacySpecContract):
    """Individual clipping with Poisson sampling (dp-accounting's Poisson-sampled Gaussian,
    add/remove); ``fedpriv-account poisson-gaussian`` answers for it."""

    spec_class = BatchClippingSpec

    def make_spec(self) -> Any:
        return BatchClippingSpec(
            noise_multiplier=1.2,
            sample_rate=1.0,  # q < 1 is calibrated in test_batch_clipping_spec.py
            sampler="poisson",  # type: ignore[arg-type]
            num_groups=8,
            group_size=1,
            epochs=None,
            local_rounds=2,
        )
