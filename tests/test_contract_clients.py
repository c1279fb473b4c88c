"""Every client algorithm, through :class:`tests.contracts.ClientAlgorithmContract`."""

from __future__ import annotations

from tests.contracts import ClientAlgorithmContract


class TestLocalDPSGD(ClientAlgorithmContract):
    """The third paper's multi-step local DP-SGD (conf/client/dpsgd.yaml)."""

    overrides = ["client=dpsgd"]
    calibration_overrides = ["privacy.sample_rate=1.0"]  # PLD calibration at q < 1: ~30 s


class TestSkellamDPSGD(ClientAlgorithmContract):
    """Local DP-SGD with Skellam noise on integers (conf/client/skellam_dpsgd.yaml); RDP only."""

    overrides = ["client=skellam_dpsgd", "privacy.accountant=rdp"]


class TestBatchClippingShuffle(ClientAlgorithmContract):
    """Batch clipping, m = 1 group, shuffling (conf/client/batch_clipping.yaml).

    Measurement: one local round whose single group is the client's whole (truncated) data,
    so every record is in it; replace-one neighbours.
    """

    overrides = ["client=batch_clipping", "client.epochs=null", "client.local_rounds=1"]
    measure_overrides = ["privacy.max_grad_norm=0.001"]
    neighbour = "replace"
    partition_overrides = {"dirichlet-0.05": ["partition.min_size=20"]}

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
    measure_overrides = ["privacy.max_grad_norm=0.001"]
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
    measure_overrides = ["privacy.sample_rate=1.0", "privacy.max_grad_norm=0.001"]
    neighbour = "replace"
    partition_overrides = {"dirichlet-0.05": ["partition.min_size=20"]}
    calibration_overrides = ["privacy.sample_rate=1.0"]


class TestCheckinFixed(ClientAlgorithmContract):
    """Random check-ins, fixed window (conf/client/checkin.yaml, privacy=checkin)."""

    overrides = ["client=checkin", "privacy=checkin", "client.num_slots=10"]
    measurable = (
        "check-in replies are single slot updates scheduled by the check-in strategy "
        "(train_message_handler); their release is not a sum over all clients"
    )


class TestCheckinAveraged(TestCheckinFixed):
    overrides = [
        "client=checkin",
        "privacy=checkin",
        "client.variant=averaged",
        "client.num_slots=10",
    ]
