"""Every privacy family's spec runs the same contract
(:class:`tests.contracts.PrivacySpecContract`): payload round trip, config schema, calibration
to a new spec, summary, refusals, degraded and local rounds never cheaper, the CLI building the
same events."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from fedpriv.accounting.batch_clipping.spec import BatchClippingSpec
from fedpriv.accounting.checkin.gaussian import CheckinGaussianSpec
from fedpriv.accounting.checkin.spec import CheckinSpec
from fedpriv.accounting.client_level.skellam_shares import ClientLevelSkellamSpec
from fedpriv.accounting.client_level.spec import ClientLevelSpec
from fedpriv.accounting.core.vocabulary import Accountant
from fedpriv.accounting.dpsgd import DPSGDSpec
from fedpriv.accounting.ftrl.spec import FTRLSpec
from fedpriv.accounting.skellam import SkellamSpec
from fedpriv.common.errors import ConfigError
from fedpriv.mechanisms.client_sampling import ClientSampling, CohortSampler
from tests.contracts import PrivacySpecContract


class TestDPSGDSpec(PrivacySpecContract):
    spec_class = DPSGDSpec

    def make_spec(self) -> Any:
        return DPSGDSpec(  # RDP keeps the contract's calibration fast; PLD's is tested apart
            noise_multiplier=1.2,
            sample_rate=0.1,
            steps=3,
            num_clients=4,
            normalizer=10.0,
            accountant="rdp",
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


class TestClientLevelSpec(PrivacySpecContract):
    """Client-level DP-FedAvg, Poisson cohort, the trusted aggregator's noise."""

    spec_class = ClientLevelSpec

    def make_spec(self) -> Any:
        cohort = CohortSampler(100, ClientSampling.POISSON, client_sample_rate=0.1, seed=1)
        return ClientLevelSpec(  # RDP: a fast calibration (PLD's: tests/test_client_level.py)
            noise_multiplier=1.0, clipping_norm=0.5, cohort=cohort, accountant="rdp"
        )

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
            "accountant": spec.accountant.value,
        }

    def test_degraded_round_events_hold_the_contributors_shares(self) -> None:
        spec = self.make_spec()
        ((event, _),) = spec.degraded_round_events(4)
        assert event.event.noise_multiplier == pytest.approx(math.sqrt(4 / 10) / 2, rel=1e-12)
        assert spec.degraded_round_events(12) == spec.round_events()


class TestClientLevelSpecSharesAdaptivePld(TestClientLevelSpecSharesAdaptive):
    """The same under the PLD accountant (the default): the dominating pair's event, whose
    multiplier is per unit C (the 2C of replace-one is inside the pair)."""

    def make_spec(self) -> Any:
        return dataclasses.replace(super().make_spec(), accountant=Accountant.PLD)

    def test_degraded_round_events_hold_the_contributors_shares(self) -> None:
        spec = self.make_spec()
        ((event, _),) = spec.degraded_round_events(4)
        assert event.noise_multiplier == pytest.approx(math.sqrt(4 / 10), rel=1e-12)
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


class TestFTRLSpec(PrivacySpecContract):
    """Client-level DP-FTRL, tree aggregation (Honaker), 3 participations 4 rounds apart."""

    spec_class = FTRLSpec
    num_rounds = 12

    def make_spec(self) -> Any:
        return FTRLSpec(
            noise_multiplier=2.0,
            factorization="tree_honaker",
            participation="min_separation",
            max_participations=3,
            min_separation=4,
            num_rounds=12,
            cohort=CohortSampler(40),
        )

    def cli_params(self, spec: Any) -> dict[str, str]:
        return {
            "noise_multiplier": str(spec.noise_multiplier),
            "factorization": "tree_honaker",
            "participation": "min_separation",
            "max_participations": "3",
            "min_separation": "4",
            "num_rounds": "12",
            "target_delta": str(spec.target_delta),
        }


class TestFTRLSpecAmplified(TestFTRLSpec):
    """Amplified BandMF: cyclic Poisson over 3 groups at q = 0.5 (RDP), 3 bands."""

    def make_spec(self) -> Any:
        cohort = CohortSampler(60, ClientSampling.POISSON, client_sample_rate=0.5)
        return FTRLSpec(
            noise_multiplier=1.5,
            factorization="banded",
            participation="cyclic_poisson",
            min_separation=3,
            num_rounds=12,
            cohort=cohort,
            accountant=Accountant.RDP,
        )

    def cli_params(self, spec: Any) -> dict[str, str]:
        return {
            "noise_multiplier": str(spec.noise_multiplier),
            "factorization": "banded",
            "participation": "cyclic_poisson",
            "min_separation": "3",
            "num_clients": "60",
            "client_sample_rate": "0.5",
            "num_rounds": "12",
            "accountant": "rdp",
            "target_delta": str(spec.target_delta),
        }
