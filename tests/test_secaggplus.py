"""SecAgg+ aggregator: exact integer sums through Flower's real SecAgg+ protocol.

The end-to-end test runs Flower's simulation engine (Ray backend) with four probe clients
whose integer updates are a known function of (seed, partition, round), so the expected sum
is computed independently here, and compares SecAgg+ with the ideal aggregator round by round:
all clients; one client raising (dropout within tolerance); one client answering after the
timeout; two dropouts (beyond tolerance: RoundFailed); all clients again.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

import numpy as np
import pytest
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common.secure_aggregation.ndarrays_arithmetic import (
    parameters_addition,
    parameters_mod,
    parameters_subtraction,
)
from flwr.common.secure_aggregation.quantization import dequantize, quantize
from flwr.serverapp import Grid
from hypothesis import given, settings
from hypothesis import strategies as st

from clients.secagg_probe import probe_update
from fedpriv.common.errors import ConfigError
from fedpriv.run.aggregation import IdealAggregator, RoundFailed
from fedpriv.run.secagg_codec import (
    flatten_update,
    join_limb_means,
    limb_bits_for,
    pack_content,
    split_limbs,
    unpack_content,
)
from strategies import secaggplus
from strategies.secaggplus import (
    AUTO_BOUND,
    SecAggPlusAggregator,
    auto_num_shares,
    resolve_shares,
)
from tests.probe_simulation import run_probe_simulation

N, BITS, SEED = 4, 32, 2024
SHAPES = {"conv.weight": [2, 3, 4], "fc.bias": [5], "scalar": []}
# (server_round, partitions that raise, partitions that answer after the timeout, SecAgg+ ok)
PLAN = [
    (1, [], [], True),
    (2, [2], [], True),
    (3, [], [1], True),
    (4, [1, 2], [], False),
    (5, [], [], True),
]
SLEEP_S, TRAIN_TIMEOUT_S = 3.0, 1.5


def flower_mean_of(residues: list[np.ndarray], bits: int) -> list[np.ndarray]:
    """What SecAggPlusWorkflow returns for these client residues, by Flower's own functions."""
    n, limb = len(residues), limb_bits_for(bits, len(residues))
    c, t, mod = float(1 << (limb - 1)), 1 << limb, 1 << 32
    rng = np.random.default_rng(0)
    total: list[np.ndarray] | None = None
    masks: list[np.ndarray] | None = None
    for r in residues:  # client: factor t (weight 1 of max_weight 1), quantize, add a mask
        q = [np.array([t])] + quantize(split_limbs(r, bits, limb), c, t)
        mask = [rng.integers(0, mod - 1, a.shape, dtype=np.int64) for a in q]
        q = parameters_mod(parameters_addition(q, mask), mod)
        total = q if total is None else parameters_addition(total, q)
        masks = mask if masks is None else parameters_addition(masks, mask)
    assert total is not None and masks is not None
    total = parameters_mod(parameters_subtraction(parameters_mod(total, mod), masks), mod)
    means = dequantize(total[1:], c, t)  # server: dequantize, offset, divide by the factor
    return [(m - (n - 1) * c) * (t / total[0][0]) for m in means]


class TestCodec:
    @given(st.integers(2, 40), st.integers(1, 62), st.integers(0, 2**32))
    @settings(max_examples=40, deadline=None)
    def test_limbs_through_flower_arithmetic_are_exact(self, n: int, bits: int, seed: int) -> None:
        bits = min(bits, 62 - int(np.ceil(np.log2(n))))
        rng = np.random.default_rng(seed)
        residues = [rng.integers(0, 2**bits, size=50, dtype=np.int64) for _ in range(n)]
        residues[0][:2] = [0, 2**bits - 1]  # extremes
        got = join_limb_means(flower_mean_of(residues, bits), n, limb_bits_for(bits, n))
        np.testing.assert_array_equal(got, np.sum(residues, axis=0))

    def test_limb_width(self) -> None:
        assert limb_bits_for(32, 10) == 16  # 2 limbs; Lmax = 32 - 4 = 28
        assert limb_bits_for(20, 10) == 20  # 1 limb
        assert limb_bits_for(31, 1) == 31
        assert limb_bits_for(32, 2**20) == 11  # Lmax = 11 -> 3 limbs of 11

    def test_content_roundtrip(self) -> None:
        content = RecordDict(
            {
                "arrays": ArrayRecord([np.arange(6.0).reshape(2, 3)]),
                "config": ConfigRecord({"server_round": 3, "name": "x", "ids": [2**63 + 5]}),
                "metrics": MetricRecord({"loss": 0.5}),
            }
        )
        back = unpack_content(pack_content(content))
        np.testing.assert_array_equal(
            back["arrays"].to_numpy_ndarrays()[0], np.arange(6.0).reshape(2, 3)
        )
        assert back["config"]["ids"] == [2**63 + 5] and back["config"]["name"] == "x"
        assert back["metrics"]["loss"] == 0.5

    def test_flatten_refuses_floats_and_out_of_range(self) -> None:
        with pytest.raises(TypeError, match="integers only"):
            flatten_update(ArrayRecord([np.zeros(3)]), 8)
        with pytest.raises(ValueError, match=r"\[0, 2\*\*8\)"):
            flatten_update(ArrayRecord([np.array([0, 256])]), 8)
        with pytest.raises(ValueError):
            flatten_update(ArrayRecord([np.array([-1, 3])]), 8)

    def test_resolve_shares_like_flower(self) -> None:
        assert resolve_shares(1.0, 3, 4) == (4, 3)
        assert resolve_shares(0.5, 0.5, 10) == (5, 2)  # 5 shares (odd), round(2.5)=2
        assert resolve_shares(0.4, 0.5, 10) == (5, 2)  # 4 is even -> 5
        assert resolve_shares(5, 3, 10) == (5, 3)
        assert resolve_shares("auto", 0.5, 4) == (4, 2)  # few clients: every client


def binomial_cdf(x: int, k: int, p: float) -> float:
    """P[Bin(k, p) <= x], summed term by term (independent of scipy)."""
    return sum(math.comb(k, i) * p**i * (1 - p) ** (k - i) for i in range(0, min(x, k) + 1))


class TestAutoShares:
    """``num_shares="auto"``: the fewest shares whose union bounds over the round's clients (a
    secret lost to dropouts, a secret exposed to colluders) both stay below AUTO_BOUND."""

    @staticmethod
    def ok(n: int, k: int, rho: float, dropout: float, corrupt: float) -> bool:
        t = max(round(rho * k), 2)
        lost = n * binomial_cdf(t - 1, k - 1, 1 - dropout)  # a dropped client's k - 1 holders
        exposed = n * (1 - binomial_cdf(t - 1, k - 1, corrupt))  # an honest client's
        return lost <= AUTO_BOUND and exposed <= AUTO_BOUND

    @pytest.mark.parametrize(
        ("n", "rho", "dropout", "corrupt", "want"),
        [(100, 0.5, 0.1, 0.1, 35), (1000, 0.5, 0.1, 0.1, 39), (200, 0.34, 0.3, 0.1, 79)],
    )
    def test_fewest_shares_that_satisfy_both_bounds(
        self, n: int, rho: float, dropout: float, corrupt: float, want: int
    ) -> None:
        k = auto_num_shares(n, rho, dropout, corrupt)
        assert k == want
        assert self.ok(n, k, rho, dropout, corrupt)
        assert not any(self.ok(n, j, rho, dropout, corrupt) for j in range(3, k, 2))

    def test_every_client_when_no_neighbourhood_suffices(self) -> None:
        assert auto_num_shares(100, 0.5, 0.3, 0.1) == 100  # 30% dropout at threshold k/2
        assert auto_num_shares(10, 0.5, 0.1, 0.1) == 10

    def test_aggregator_resolves_auto_for_the_round(self) -> None:
        agg = SecAggPlusAggregator(max_dropout=0.1, max_corrupt=0.1)
        assert agg.num_shares == "auto"
        assert agg.shares_for(100) == (35, 18)


class TestThresholdReconstruction:
    """The unmask stage reconstructs each secret from exactly ``threshold`` shares."""

    def test_first_threshold_shares_give_the_secret(self) -> None:
        from flwr.common.secure_aggregation.crypto.shamir import create_shares

        secret = os.urandom(32)
        shares = create_shares(secret, 3, 7)
        junk = [s[:4] + os.urandom(len(s) - 4) for s in shares[3:]]  # indices kept, values not
        token = secaggplus._THRESHOLD.set(3)
        try:
            assert secaggplus._combine_threshold_shares(shares[:3] + junk) == secret
            assert secaggplus._combine_threshold_shares(shares[4:] + shares[:1]) == secret
        finally:
            secaggplus._THRESHOLD.reset(token)
        # outside an unmask stage every share is used, as Flower does: the junk shows
        try:
            outside: bytes | None = secaggplus._combine_threshold_shares(shares[:3] + junk)
        except ValueError:  # "Failed to combine shares" (the padding does not check out)
            outside = None
        assert outside != secret


class TestBadInput:
    @pytest.mark.parametrize(
        ("kwargs", "field"),
        [
            ({"num_shares": 2}, "num_shares"),
            ({"num_shares": 1.5}, "num_shares"),
            ({"num_shares": 0.0}, "num_shares"),
            ({"reconstruction_threshold": 0}, "reconstruction_threshold"),
            ({"num_shares": 5, "reconstruction_threshold": 5}, "reconstruction_threshold"),
            ({"bits": 0}, "bits"),
            ({"bits": 63}, "bits"),
            ({"stage_timeout": 0.0}, "stage_timeout"),
            ({"num_shares": "many"}, "num_shares"),
            ({"max_dropout": 1.0}, "max_dropout"),
            ({"max_corrupt": -0.1}, "max_corrupt"),
        ],
    )
    def test_constructor(self, kwargs: dict[str, Any], field: str) -> None:
        with pytest.raises(ConfigError, match=field):
            SecAggPlusAggregator(**kwargs)

    def test_threshold_above_clients(self) -> None:
        with pytest.raises(
            ConfigError,
            match=r"reconstruction_threshold=5 needs 5 shares but each client has only 4",
        ):
            SecAggPlusAggregator(num_shares=1.0, reconstruction_threshold=5, num_clients=4)
        agg = SecAggPlusAggregator(num_shares=1.0, reconstruction_threshold=5)
        dummy: list[Any] = [object()] * 4  # never sent: the check comes first
        with pytest.raises(ConfigError, match="reconstruction_threshold"):
            agg.sum_updates(None, dummy, server_round=1, timeout=1.0)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="num_clients=1"):
            agg.sum_updates(None, dummy[:1], server_round=1, timeout=1.0)  # type: ignore[arg-type]


# ---- end to end through the Flower simulation engine -------------------------------------
def _messages(
    nodes: list[int], server_round: int, fail: list[int], late: list[int]
) -> list[Message]:
    cfg = ConfigRecord(
        {
            "seed": SEED,
            "server_round": server_round,
            "bits": BITS,
            "shapes": json.dumps(SHAPES),
            "fail_partitions": fail or [-1],
            "sleep_partitions": late or [-1],
            "sleep_seconds": SLEEP_S,
        }
    )
    return [
        Message(
            RecordDict({"config": cfg}),
            dst_node_id=nid,
            message_type=MessageType.TRAIN,
            group_id=str(server_round),
        )
        for nid in nodes
    ]


def _run(
    agg: Any, grid: Grid, nodes: list[int], server_round: int, fail: list[int], late: list[int]
) -> Any:
    timeout = TRAIN_TIMEOUT_S if late else 30.0
    try:
        return agg.sum_updates(
            grid,
            _messages(nodes, server_round, fail, late),
            server_round=server_round,
            timeout=timeout,
        )
    except RoundFailed as exc:
        return exc


@pytest.fixture(scope="module")
def simulation() -> dict[Any, Any]:
    def rounds(grid: Grid, nodes: list[int], out: dict[Any, Any]) -> None:
        out["node_ids"] = nodes
        sec = SecAggPlusAggregator(
            num_shares=1.0, reconstruction_threshold=3, bits=BITS, stage_timeout=30.0
        )
        for server_round, fail, late, ok in PLAN:
            out[("secagg", server_round)] = _run(sec, grid, nodes, server_round, fail, late)
            out[("dropped", server_round)] = sec.last_num_dropped
            ideal = IdealAggregator(min_replies=N - len(fail) - len(late) if ok else None)
            # reference: the late clients raise instead (a sleeping Ray actor would delay
            # the rest)
            out[("ideal", server_round)] = _run(ideal, grid, nodes, server_round, fail + late, [])
            if late:  # let the straggler finish: in simulation its stale context write-back
                time.sleep(SLEEP_S)  # would otherwise clobber the next round's SecAgg+ state

    return run_probe_simulation(N, rounds)


def expected_sum(server_round: int, fail: list[int], n: int = N) -> dict[str, np.ndarray]:
    """Independent expected total: sum of the probe updates of the surviving partitions."""
    ups = [probe_update(SEED, p, server_round, SHAPES, BITS) for p in range(n) if p not in fail]
    return {k: np.sum([u[k] for u in ups], axis=0) for k in SHAPES}


@pytest.mark.slow
class TestEndToEnd:
    def test_node_ids_are_big_python_ints(self, simulation: dict[str, Any]) -> None:
        assert all(isinstance(i, int) for i in simulation["node_ids"])

    @pytest.mark.parametrize(("server_round", "fail", "late", "ok"), PLAN)
    def test_secagg_equals_ideal_and_expected(
        self,
        simulation: dict[str, Any],
        server_round: int,
        fail: list[int],
        late: list[int],
        ok: bool,
    ) -> None:
        sec = simulation[("secagg", server_round)]
        ideal = simulation[("ideal", server_round)]
        if not ok:  # beyond tolerance: both refuse the round
            assert isinstance(sec, RoundFailed) and "halted" in str(sec)
            assert "drops out" in str(sec)  # the clients' own error reasons are reported
            assert isinstance(ideal, RoundFailed)
            return
        assert not isinstance(sec, RoundFailed), sec
        gone = fail + late
        expected = expected_sum(server_round, gone)
        assert sec.num_clients == ideal.num_clients == N - len(gone)
        assert simulation[("dropped", server_round)] == len(gone)
        assert sec.metrics == ideal.metrics == {"clients": float(N - len(gone))}
        for key, arr in expected.items():
            assert sec.total[key].dtype == np.int64 and sec.total[key].shape == tuple(SHAPES[key])
            np.testing.assert_array_equal(sec.total[key], arr)
            np.testing.assert_array_equal(sec.total[key], ideal.total[key])


# ---- a sparse neighbourhood: 5 shares among 12 clients ----------------------------------------
N_SPARSE = 12
#: (server_round, partitions that raise): with 5 shares and threshold 3 any 2 dropouts leave
#: every secret 3 live holders, wherever Flower's random ring puts them.
PLAN_SPARSE = [(1, []), (2, [3, 7]), (3, [0, 11])]


@pytest.fixture(scope="module")
def sparse_simulation() -> dict[Any, Any]:
    def rounds(grid: Grid, nodes: list[int], out: dict[Any, Any]) -> None:
        sec = SecAggPlusAggregator(
            num_shares=5, reconstruction_threshold=3, bits=BITS, stage_timeout=30.0
        )
        for server_round, fail in PLAN_SPARSE:
            out[server_round] = _run(sec, grid, nodes, server_round, fail, [])

    return run_probe_simulation(N_SPARSE, rounds)


@pytest.mark.slow
@pytest.mark.parametrize(("server_round", "fail"), PLAN_SPARSE)
def test_sparse_neighbourhood_sum_is_exact(
    sparse_simulation: dict[Any, Any], server_round: int, fail: list[int]
) -> None:
    """Each secret is reconstructed from exactly 3 of its holders' shares (the unmask stage's
    threshold): the sum over the survivors is still exact."""
    sec = sparse_simulation[server_round]
    assert not isinstance(sec, RoundFailed), sec
    assert sec.num_clients == N_SPARSE - len(fail)
    for key, arr in expected_sum(server_round, fail, N_SPARSE).items():
        np.testing.assert_array_equal(sec.total[key], arr)
