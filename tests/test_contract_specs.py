"""Every privacy family's spec runs the same contract
(:class:`tests.contracts.PrivacySpecContract`): payload round trip, config schema, calibration
to a new spec, summary, refusals, degraded and local rounds never cheaper, the CLI building the
same events."""

from __future__ import annotations

from typing import Any

from fedpriv.accounting.batch_clipping import BatchClippingSpec
from fedpriv.accounting.checkin_gaussian import CheckinGaussianSpec
from fedpriv.accounting.checkin_spec import CheckinSpec
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


class TestCheckinSpec(PrivacySpecContract):
    """Random check-ins with local randomizers (privacy=checkin): the fixed window, bound as a
    client binds it; the noise parameter is the local randomizer's ε0."""

    spec_class = CheckinSpec

    def make_spec(self) -> Any:
        return CheckinSpec(
            variant="fixed",
            local_epsilon=1.0,
            num_clients=1000,
            num_slots=100,
            checkin_probability=0.5,
            num_rounds=3,
        )

    def cli_params(self, spec: Any) -> dict[str, str]:
        return {
            "variant": spec.variant.value,
            "local_epsilon": str(spec.local_epsilon),
            "local_delta": str(spec.local_delta),
            "num_clients": str(spec.num_clients),
            "num_slots": str(spec.num_slots),
            "checkin_probability": str(spec.checkin_probability),
            "randomizer": spec.randomizer.value,
            "clipping_norm": str(spec.clipping_norm),
            "target_delta": str(spec.target_delta),
        }


class TestCheckinSpecSlidingWindow(TestCheckinSpec):
    """The sliding window (Theorem 4.3 answers below ε0 here: 0.44 < 0.5)."""

    def make_spec(self) -> Any:
        return CheckinSpec(
            variant="sliding-window",
            local_epsilon=0.5,
            num_clients=500,
            num_slots=100,
            num_rounds=3,
        )


class TestCheckinGaussianSpec(PrivacySpecContract):
    """Check-ins with central Gaussian slot sums (privacy=checkin_gaussian): σ of each slot's
    sum; random-allocation PLD (2 slots keep the PLDs fast)."""

    spec_class = CheckinGaussianSpec
    bad_noise = 0.0  # no noiseless analysis

    def make_spec(self) -> Any:
        return CheckinGaussianSpec(
            noise_multiplier=1.0,
            num_slots=2,
            checkin_probability=0.5,
            num_clients=20,
            num_rounds=3,
        )

    def cli_params(self, spec: Any) -> dict[str, str]:
        return {
            "noise_multiplier": str(spec.noise_multiplier),
            "num_slots": str(spec.num_slots),
            "checkin_probability": str(spec.checkin_probability),
            "num_clients": str(spec.num_clients),
            "clipping_norm": str(spec.clipping_norm),
            "target_delta": str(spec.target_delta),
        }
