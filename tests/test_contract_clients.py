"""Every client algorithm, through :class:`tests.contracts.ClientAlgorithmContract`."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import pytest

from fedpriv.common.wire import METRICS_KEY, UPDATE_KEY
from tests.contracts import PARTITIONS, ClientAlgorithmContract, parse_reply


class TestLocalDPSGD(ClientAlgorithmContract):
    """The third paper's multi-step local DP-SGD (conf/client/dpsgd.yaml)."""

    overrides = ["client=dpsgd"]
    calibration_overrides = ["privacy.sample_rate=1.0"]  # PLD calibration at q < 1: ~30 s


class _ImagesOnly:
    """Augmentation multiplicity needs images: the natural partition (ACS Income, tabular) is
    refused before training, so these members measure the image partitions only."""

    @pytest.mark.parametrize("partition", ["iid", "dirichlet-0.05"])
    def test_effective_noise_multiplier_of_the_released_sum(
        self, partition: str, shared_data: Any
    ) -> None:
        super().test_effective_noise_multiplier_of_the_released_sum(  # type: ignore[misc]
            partition, shared_data
        )


class TestLocalDPSGDAugmult(_ImagesOnly, TestLocalDPSGD):
    """Local DP-SGD with augmentation multiplicity (K = 3 crop-and-flip views per record,
    their gradients averaged before the clip): the same sensitivity and noise, measured from
    the replies (issue 28, item 2)."""

    overrides = ["client=dpsgd", "client.augmult=3"]


class TestSkellamDPSGD(ClientAlgorithmContract):
    """Local DP-SGD with Skellam noise on integers (conf/client/skellam_dpsgd.yaml, which
    selects privacy=skellam: RDP only, its default accountant; PLD is refused before training,
    so the calibration test skips it)."""

    overrides = ["client=skellam_dpsgd"]

    @pytest.mark.slow  # per-sample rounding of 6000 x 7850 values: ~10-20 s per partition
    @pytest.mark.parametrize("partition", PARTITIONS)
    def test_effective_noise_multiplier_of_the_released_sum(
        self, partition: str, shared_data: Any
    ) -> None:
        super().test_effective_noise_multiplier_of_the_released_sum(partition, shared_data)


class TestSkellamDPSGDAugmult(_ImagesOnly, TestSkellamDPSGD):
    """Skellam local DP-SGD with K = 3 augmented views per record (issue 28, item 2)."""

    overrides = ["client=skellam_dpsgd", "client.augmult=3"]


class TestBatchClippingShuffle(ClientAlgorithmContract):
    """Batch clipping, m = 1 group, shuffling (conf/client/batch_clipping.yaml).

    Measurement: one local round whose single group is the client's whole (truncated) data,
    so every record is in it; replace-one neighbours.
    """

    overrides = ["client=batch_clipping", "client.epochs=null", "client.local_rounds=1"]
    measure_overrides = ["privacy.clipping_norm=0.001"]
    neighbour = "replace"
    # a group that fits the smallest client, so the plan is valid before it is sized
    partition_overrides = {"dirichlet-0.05": ["partition.min_size=20", "client.group_size=20"]}

    def sized_overrides(self, min_n: int) -> list[str]:
        return [f"client.group_size={min_n}"]


class TestIndividualClippingSubsample(ClientAlgorithmContract):
    """Individual clipping (s = 1), subsampling (conf/client/individual_clipping.yaml).

    Measurement: one local round of m = N groups (every record of the truncated data)."""

    overrides = [
        "client=individual_clipping",
        "client.epochs=null",
        "client.local_rounds=1",
        "client.num_groups=16",
    ]
    measure_overrides = ["privacy.clipping_norm=0.001"]
    neighbour = "replace"
    partition_overrides = {"dirichlet-0.05": ["partition.min_size=20"]}

    def sized_overrides(self, min_n: int) -> list[str]:
        return [f"client.num_groups={min_n}"]


class TestIndividualClippingPoisson(ClientAlgorithmContract):
    """Individual clipping with Poisson sampling (client=individual_clipping sampler=poisson).

    Add/remove relation, but the client truncates its data to the smallest client's size N,
    so removing a record of the smallest client is refused; the neighbour replaces a record
    (two add/remove steps: its influence is halved)."""

    overrides = [
        "client=individual_clipping",
        "sampler=poisson",
        "client.epochs=null",
        "client.local_rounds=1",
    ]
    measure_overrides = ["privacy.sample_rate=1.0", "privacy.clipping_norm=0.001"]
    neighbour = "replace"
    partition_overrides = {"dirichlet-0.05": ["partition.min_size=20"]}
    calibration_overrides = ["privacy.sample_rate=1.0"]


class TestIndividualClippingPoissonSecure(TestIndividualClippingPoisson):
    """The same in ``privacy.secure_mode`` with RDP: each local round's noisy sum is a lattice
    point with discrete Gaussian noise (OS entropy), accounted by its own RDP event."""

    overrides = [
        *TestIndividualClippingPoisson.overrides,
        "privacy.secure_mode=true",
        "privacy.accountant=rdp",
    ]


class TestIndividualClippingPoissonPldSecure(TestIndividualClippingPoisson):
    """Secure mode with the default ``privacy.accountant=pld`` (issue 40): the same lattice
    noise, accounted by RDP instead (the PLD assumes continuous noise)."""

    overrides = [*TestIndividualClippingPoisson.overrides, "privacy.secure_mode=true"]


class TestCheckinFixed(ClientAlgorithmContract):
    """Random check-ins, fixed window (conf/client/checkin.yaml, privacy=checkin)."""

    overrides = ["client=checkin", "privacy=checkin", "client.num_slots=10"]
    measurable = (
        "check-in replies are single slot updates scheduled by the check-in strategy "
        "(message_handler(TRAIN): the slot handler); their release is not a sum over all "
        "clients (the local release is measured by test_local_release_noise_multiplier)"
    )

    def test_local_release_noise_multiplier(self) -> None:
        """A client's own release (its local randomizer, the ``local_events``), measured from
        its serialized replies: noise scale over the replace-one influence of its whole data
        (client 0's data replaced by client 1's, same noise seeds, every gradient clipped), in
        the randomizer's norm (l1 for Laplace: scale b = std / sqrt(2); l2 for Gaussian), is
        >= the event's noise multiplier. Sampling error of the std from 3 x 7850 Laplace
        draws: about sqrt(5 / (4 * 2 * 7850)) = 0.9% (2 degrees of freedom per coordinate);
        allowed: ``sigma_rtol`` = 5%."""
        from fedpriv.run.setup import client_partition

        cfg = self.config(["privacy.clipping_norm=0.001"])
        algorithm = self.build(cfg)
        ((event, _),) = algorithm.privacy.local_events()
        kind = str(event.kind)
        d0, d1 = client_partition(cfg, 0), client_partition(cfg, 1)

        def release(data: Any, seed: int) -> np.ndarray:
            reply = parse_reply(self.reply_bytes(algorithm, cfg, data[0], data[1], 0, seed))
            arrays = reply.content.array_records[UPDATE_KEY].to_numpy_ndarrays()
            return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])

        seeds = (21, 22, 23)
        same = np.stack([release(d0, s) for s in seeds])
        std = float(np.sqrt(np.mean(np.var(same, axis=0, ddof=1))))
        scale = std / np.sqrt(2.0) if kind == "laplace" else std
        diff = same[0] - release(d1, seeds[0])
        influence = float(np.abs(diff).sum() if kind == "laplace" else np.linalg.norm(diff))
        measured = scale / influence
        assert measured >= event.noise_multiplier * (1 - self.sigma_rtol), (
            measured,
            event.noise_multiplier,
        )


class TestCheckinAveraged(TestCheckinFixed):
    overrides = [
        "client=checkin",
        "privacy=checkin",
        "client.variant=averaged",
        "client.num_slots=10",
    ]


class TestCheckinGaussian(ClientAlgorithmContract):
    """Check-ins with central Gaussian slot sums (conf/client/checkin_gaussian.yaml,
    privacy=checkin_gaussian): PLD only (random allocation), so the RDP calibrations are
    refused before training and skipped."""

    overrides = ["client=checkin_gaussian", "client.num_slots=10"]
    calibration_overrides = ["client.num_slots=2"]  # random-allocation PLDs of 2 slots: fast
    measurable = (
        "each checked-in client sends its clipped gradient without noise; the trusted "
        "aggregator adds the slot's Gaussian (measured by tests/test_checkin_gaussian.py "
        "test_slot_release_noise_is_what_the_events_claim)"
    )

    def test_reply_is_the_clipped_gradient_without_noise(self) -> None:
        """From the serialized replies: the same bytes for two noise seeds (no local noise)
        and an L2 norm of exactly C (every gradient is above C = 0.001: clipped; float32
        rounding 1e-6 relative)."""
        from fedpriv.run.setup import client_partition

        cfg = self.config(["privacy.clipping_norm=0.001"])
        algorithm = self.build(cfg)
        x, y = client_partition(cfg, 0)

        def release(seed: int) -> np.ndarray:
            reply = parse_reply(self.reply_bytes(algorithm, cfg, x, y, 0, seed))
            arrays = reply.content.array_records[UPDATE_KEY].to_numpy_ndarrays()
            return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])

        a, b = release(21), release(22)
        assert np.array_equal(a, b)
        assert float(np.linalg.norm(a)) == pytest.approx(0.001, rel=1e-6)
        assert algorithm.privacy.local_events() == []


class TestCheckinGaussianSecure(TestCheckinGaussian):
    """Secure mode (issue 40): the server's slot sums are lattice points with discrete Gaussian
    noise, one Poisson(p0)-subsampled release per pass accounted by RDP; the client's reply
    is the same clipped gradient."""

    overrides = [*TestCheckinGaussian.overrides, "privacy.secure_mode=true"]


# ---- the instrument itself, on two algorithms whose effective σ is known in closed form -----
class _PublicNormalizer:
    """One step of DP-SGD on the whole client: (sum of clipped gradients + N(0, (σC)²/N)) / K
    with a public K: every record's effective σ on the sum is exactly σ."""

    sigma, clip, public = 1.2, 0.001, 600.0

    def __init__(self, num_clients: int) -> None:
        from fedpriv.accounting.dpsgd import DPSGDSpec

        self.num_clients = num_clients
        # its events: one Gaussian of σ per round (q = 1, one step)
        self.privacy = DPSGDSpec(noise_multiplier=self.sigma, sample_rate=1.0, steps=1)

    def divisor(self, n: int) -> float:
        return self.public

    def decode_sum(self, total: Any, shapes: Any, server_round: int) -> Any:
        return total

    def train(self, model: Any, data: Any, ctx: Any) -> tuple[dict[str, Any], dict[str, float]]:
        from clients.local_dpsgd import summed_cross_entropy
        from fedpriv.mechanisms.noise import add_gaussian_noise
        from fedpriv.mechanisms.persample import clipped_grad_sum

        sums, _ = clipped_grad_sum(model, summed_cross_entropy, data.x, data.y, self.clip)
        std = self.sigma * self.clip / np.sqrt(self.num_clients)
        noisy = add_gaussian_noise(sums, std, ctx.generator)
        return {k: v / self.divisor(len(data)) for k, v in noisy.items()}, {}


class _OwnSizeDivisor(_PublicNormalizer):
    """Divides by the client's own size (today's LocalDPSGD with q = 1)."""

    def divisor(self, n: int) -> float:
        return float(max(n, 1))


class _Instrument(ClientAlgorithmContract):
    """The contract's measurement, applied to one of the known algorithms above."""

    overrides = ["client=dpsgd"]

    def __init__(self, algorithm_class: Any) -> None:
        self.algorithm_class = algorithm_class

    def build(self, cfg: Any) -> Any:
        return self.algorithm_class(cfg.num_clients)


class TestMeasurementInstrument:
    """The measurement recovers a known effective σ (two-sided, 5%) and detects a divisor that
    depends on the client's own data size (dirichlet alpha = 0.05: the 2-record client)."""

    def test_recovers_the_known_sigma(self) -> None:
        inst = _Instrument(_PublicNormalizer)
        sigma, measured = inst.effective_sigmas(inst.measurement_config("dirichlet-0.05", None))
        assert sigma == 1.2
        for value in measured.values():
            assert value == pytest.approx(sigma, rel=inst.sigma_rtol)

    def test_detects_an_own_size_divisor(self) -> None:
        inst = _Instrument(_OwnSizeDivisor)
        sigma, measured = inst.effective_sigmas(inst.measurement_config("dirichlet-0.05", None))
        assert min(measured.values()) < 0.5 * sigma, measured


class _WholeClientNeighbour:
    """Client-level neighbours: the measured client's WHOLE data removed (its update becomes
    0, its noise share stays the same coupled draw); every delta clipped (C = 0.001, far below
    the deltas' norms), so the influence is C, the sensitivity the events are stated for."""

    measure_overrides: ClassVar[list[str]] = ["privacy.clipping_norm=0.001"]

    def neighbour_data(
        self, cfg: Any, pid: int, x: np.ndarray, y: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        return x[:0], y[:0]


class TestClientLevelDPFedAvg(_WholeClientNeighbour, ClientAlgorithmContract):
    """Client-level DP-FedAvg (conf/client/client_level.yaml), every client every round, each
    client drawing its noise share (``noise_placement=clients``: the replies carry the noise
    the measurement sees; the trusted aggregator's noise, drawn in ``release``, is measured by
    tests/test_client_level.py::test_server_release_noise_and_count_noise_give_the_effective_
    multiplier)."""

    overrides = ["client=client_level", "client.noise_placement=clients"]


class TestClientLevelDPFedAvgAugmult(_ImagesOnly, TestClientLevelDPFedAvg):
    """Client-level DP-FedAvg whose local training sees 2 augmented views of every record
    (issue 28, item 2): the clipped delta's sensitivity and noise are unchanged."""

    overrides = ["client=client_level", "client.noise_placement=clients", "client.augmult=2"]


class TestClientLevelSkellam(_WholeClientNeighbour, ClientAlgorithmContract):
    """Client-level DP-FedAvg with integer Skellam shares (conf/client/client_level_skellam.yaml);
    RDP only."""

    overrides = ["client=client_level_skellam", "privacy.accountant=rdp"]


class TestClientLevelFTRL(_WholeClientNeighbour, ClientAlgorithmContract):
    """Client-level DP-FTRL (conf/client/client_level_ftrl.yaml), the identity strategy, every
    client every round (k = 3 participations 1 round apart). The replies carry the clipped
    deltas only: the trusted aggregator draws the correlated noise in ``release``."""

    overrides = [
        "client=client_level_ftrl",
        "privacy.factorization=identity",
        "privacy.participation=min_separation",
        "privacy.max_participations=3",
        "privacy.min_separation=1",
    ]
    measurable = (
        "the noise is the server's correlated stream, not in the replies: the release is "
        "DP-FedAvg's noise bit for bit (tests/test_ftrl.py), the stream is M Z "
        "(tests/test_correlated_noise.py); the replies' norms are measured below"
    )

    def test_noise_draws_equal_events(self) -> None:
        """The client draws no noise (``noise_draws`` 0); the server's draws are the stream's."""
        from fedpriv.run.setup import client_partition

        cfg = self.config()
        algorithm = self.build(cfg)
        reply = parse_reply(self.reply_bytes(algorithm, cfg, *client_partition(cfg, 0), 0, 1))
        assert reply.content.metric_records[METRICS_KEY]["noise_draws"] == 0

    def test_reply_is_the_delta_clipped_to_c(self) -> None:
        """Measured from the serialized reply: every client's update has L2 norm <= C (the
        sensitivity of one participation the events are stated for), C = 0.001."""
        from fedpriv.run.setup import client_partition

        cfg = self.config(self.measure_overrides)
        algorithm = self.build(cfg)
        for pid in range(3):
            reply = parse_reply(
                self.reply_bytes(algorithm, cfg, *client_partition(cfg, pid), pid, 1)
            )
            arrays = reply.content.array_records[UPDATE_KEY].to_numpy_ndarrays()
            norm = math.sqrt(sum(float((a.astype(np.float64) ** 2).sum()) for a in arrays))
            assert 0 < norm <= 0.001
