"""Random check-ins end to end: client randomness, slots, randomizers, accounting, Flower."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path
from typing import Any

import mpmath
import numpy as np
import pytest
import scipy.stats
import torch
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

from fedpriv.accounting.accountants.gdp import analytic_gaussian_sigma
from fedpriv.accounting.checkin.events import CheckinEvent, PoissonLocalEvent
from fedpriv.accounting.checkin.spec import CheckinSpec
from fedpriv.accounting.loss_models.local_randomizer import calibrated_randomizer
from fedpriv.accounting.samplers.checkin import expected_dummy_updates
from fedpriv.common.errors import ConfigError
from fedpriv.common.wire import ABSTAIN, CHECKIN_KEY
from fedpriv.mechanisms.checkin_draw import (
    CheckinVariant,
    checkin_rng,
    checkin_window,
    draw_checkin,
)
from fedpriv.mechanisms.randomizers import LocalRandomizer
from fedpriv.run.algorithm import MessageKind
from fedpriv.run.config import compose_config
from fedpriv.run.prepare import prepare
from fedpriv.run.runner import run_experiment
from strategies import checkin_server as server
from strategies.checkin_server import (
    CheckinStrategy,
    PassProtocol,
    occupancy,
    plan_pass,
    update_slots,
)

REPO = Path(__file__).resolve().parents[1]
BASE = ["client=checkin", "privacy=checkin", "strategy=checkin", "model=logistic"]


def _cfg(overrides: list[str]):
    return compose_config([*BASE, *overrides])


# --------------------------------------------------------------------------- client randomness
def test_slot_choices_are_reproducible_and_uniform() -> None:
    m, draws = 10, 20_000
    slots = [
        draw_checkin(checkin_rng(0, r, pid, False), 1.0, (1, m))
        for r in range(20)
        for pid in range(1000)
    ]
    again = [
        draw_checkin(checkin_rng(0, r, pid, False), 1.0, (1, m))
        for r in range(20)
        for pid in range(1000)
    ]
    assert slots == again
    counts = np.bincount(slots, minlength=m + 1)[1:]
    assert counts.sum() == draws
    # chi-square goodness of fit to uniform on 1..m; fixed seeds, so this is deterministic
    assert scipy.stats.chisquare(counts).pvalue > 1e-3
    other_seed = [draw_checkin(checkin_rng(1, 0, pid, False), 1.0, (1, m)) for pid in range(1000)]
    assert other_seed != slots[:1000]


def test_secure_mode_checkins_are_not_seeded() -> None:
    a = [draw_checkin(checkin_rng(0, 1, pid, True), 1.0, (1, 1000)) for pid in range(50)]
    b = [draw_checkin(checkin_rng(0, 1, pid, True), 1.0, (1, 1000)) for pid in range(50)]
    assert a != b  # probability of equality 1000^-50


@pytest.mark.parametrize("p0", [0.05, 0.3, 1.0])
def test_checkin_probability_is_honoured(p0: float) -> None:
    n = 20_000
    answers = [draw_checkin(checkin_rng(3, 1, pid, False), p0, (1, 7)) for pid in range(n)]
    rate = np.mean([a != ABSTAIN for a in answers])
    # binomial standard error sqrt(p(1-p)/n) <= 0.0036; 5 standard errors
    assert abs(rate - p0) <= 5 * math.sqrt(p0 * (1 - p0) / n) + 1e-12


def test_sliding_window_checkins_stay_in_each_clients_window() -> None:
    n, m = 300, 40
    for pid in range(n):
        first, last = checkin_window("sliding-window", m, pid)
        assert (first, last) == (pid + 1, pid + m)
        for r in range(5):
            slot = draw_checkin(checkin_rng(0, r, pid, False), 1.0, (first, last))
            assert first <= slot <= last
    # the server uses only times m..n; check-ins outside are dropped
    answers = {10: 5, 11: m, 12: n, 13: n + 3, 14: ABSTAIN}
    occ = occupancy(answers, update_slots("sliding-window", m, n))
    assert sorted(occ) == list(range(m, n + 1))
    assert occ[m] == [11] and occ[n] == [12] and sum(map(len, occ.values())) == 2


# --------------------------------------------------------------------------- server side
def test_server_code_path_sees_only_replies() -> None:
    tree = ast.parse(Path(server.__file__).read_text())
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    used |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    used |= {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    }
    for word in (
        "partition-id",
        "node_config",
        "client_partition",
        "partitions",
        "Context",
        "run_dataset",
    ):
        assert word not in used, word
    # planning is a function of (client id -> slot) replies and the server's own rng only
    answers = {101: 1, 102: 1, 103: 3, 104: ABSTAIN}
    occ = occupancy(answers, range(1, 5))
    assert occ == {1: [101, 102], 2: [], 3: [103], 4: []}
    fixed = plan_pass("fixed", occ, np.random.default_rng(0))
    assert [len(t.clients) for t in fixed] == [1, 0, 1, 0] and fixed[0].clients[0] in (101, 102)
    averaged = plan_pass("averaged", occ, np.random.default_rng(0))
    assert [t.clients for t in averaged] == [(101, 102), (), (103,), ()]
    # random tickets (not client ids) order a slot's check-ins, so ids never steer the pick
    assert occupancy(answers, range(1, 5), {101: 9, 102: 3, 103: 1})[1] == [102, 101]


def test_fixed_window_picks_uniformly_among_checked_in() -> None:
    occ = {1: [7, 8, 9]}
    picks = [plan_pass("fixed", occ, np.random.default_rng(s))[0].clients[0] for s in range(3000)]
    counts = np.array([picks.count(k) for k in (7, 8, 9)])
    assert scipy.stats.chisquare(counts).pvalue > 1e-3


class FakeGrid:
    """Worker nodes ``1000 + w``: answers slot messages with update = client id * ones for each
    named (client, slot) pair, stacked; records the (client, slot) pairs asked and the calls."""

    def __init__(self, answers: dict[int, int], shapes: dict[str, tuple[int, ...]]) -> None:
        self.answers, self.shapes, self.asked, self.calls = answers, shapes, [], 0
        self.messages: list[int] = []

    def send_and_receive(
        self, messages: list[Message], timeout: float | None = None
    ) -> list[Message]:
        from fedpriv.run.engine import named_clients, row_blocks, stacked_reply

        self.calls += 1
        self.messages.append(len(messages))
        nodes = [m.metadata.dst_node_id for m in messages]
        assert len(nodes) == len(set(nodes))  # one message per worker per send
        out = []
        for msg in messages:
            clients = named_clients(msg)
            slots = [int(s) for s in msg.content.config_records["config"]["slots"]]
            updates = []
            for client, slot in zip(clients, slots, strict=True):
                if self.answers is not None:
                    assert self.answers[client] == slot  # only the slot it checked into
                self.asked.append((client, slot))
                updates.append({k: np.full(s, float(client)) for k, s in self.shapes.items()})
            reply = stacked_reply(msg, row_blocks(clients, updates, [{} for _ in clients]), {})
            reply.content.config_records["config"]["slots"] = slots
            out.append(reply)
        return out


def hosts_of(clients: range, workers: int = 2) -> np.ndarray:
    """Client -> worker node id (1000 + w), as the strategy's contiguous shares."""
    return server.client_hosts([1000 + w for w in range(workers)], len(clients))[1]


HOSTS = hosts_of(range(40))


class FakeJob:
    round_timeout = 10.0

    def evaluate_state(self, state: dict[str, np.ndarray]) -> tuple[float, float]:
        return 0.0, 0.0


class MarkerRandomizer(LocalRandomizer):
    """Dummy noise = a marker value, so dummy steps are visible in the state."""

    def noise(
        self, shapes: dict[str, Any], generator: Any, dtype: Any = None
    ) -> dict[str, torch.Tensor]:
        return {k: torch.full(tuple(s), 1000.0, dtype=torch.float64) for k, s in shapes.items()}


def fake_protocol(variant: str) -> PassProtocol:
    """A pass of ``variant`` whose dummy updates are :class:`MarkerRandomizer`'s."""
    return PassProtocol(
        CheckinVariant(variant), 5, 40, 1.0, dummy=MarkerRandomizer("laplace", 1.0, 1.0)
    )


@pytest.mark.parametrize("variant", ["fixed", "averaged"])
def test_dummies_exactly_on_empty_slots_and_averaged_skips(
    task_identity: None, variant: str
) -> None:
    answers = {11: 1, 12: 1, 13: 3, 14: 3, 15: 3, 16: ABSTAIN}
    occ = occupancy(answers, range(1, 6))
    tasks = plan_pass(variant, occ, np.random.default_rng(0))
    shapes = {"w": (2,)}
    grid = FakeGrid(answers, shapes)
    strat = CheckinStrategy(batch_size=1, lr=1.0)
    state0 = {"w": np.zeros(2)}
    trace, state = [], state0
    for task in tasks:  # one slot at a time, to see each step
        new, stats = strat.run_slots(
            grid, FakeJob(), fake_protocol(variant), [task], state, 1, torch.Generator(), HOSTS
        )
        trace.append(float(state["w"][0] - new["w"][0]))
        state = new
    if variant == "fixed":
        assert trace[1] == trace[3] == trace[4] == 1000.0  # dummies on the empty slots 2, 4, 5
        assert trace[0] in (11.0, 12.0) and trace[2] in (13.0, 14.0, 15.0)
        assert len(grid.asked) == 2
    else:
        assert trace == [11.5, 0.0, 14.0, 0.0, 0.0]  # slot means; empty slots skipped
        assert sorted(grid.asked) == [(11, 1), (12, 1), (13, 3), (14, 3), (15, 3)]


def test_minibatch_sends_one_request_per_step(task_identity: None) -> None:
    answers = {node: 1 + node % 10 for node in range(40)}
    tasks = plan_pass("fixed", occupancy(answers, range(1, 11)), np.random.default_rng(1))
    grid = FakeGrid(answers, {"w": (1,)})
    new, stats = CheckinStrategy(batch_size=5, lr=1.0).run_slots(
        grid,
        FakeJob(),
        fake_protocol("fixed"),
        tasks,
        {"w": np.zeros(1)},
        1,
        torch.Generator(),
        HOSTS,
    )
    assert grid.calls == 2 and stats["updates"] == 10 and stats["dummies"] == 0
    assert stats["round_trips"] == 2 and all(k <= 2 for k in grid.messages)  # <= 1 per worker
    # two steps, each the mean of its 5 slot updates
    picked = [n for n, _ in grid.asked]
    assert new["w"][0] == pytest.approx(-(np.mean(picked[:5]) + np.mean(picked[5:])))


def test_poisson_client_in_several_slots_of_a_block_reports_once_per_slot(
    task_identity: None,
) -> None:
    occ = {1: [5, 26], 2: [5], 3: [], 4: [5, 27]}
    tasks = plan_pass("poisson", occ, np.random.default_rng(0))
    grid = FakeGrid({}, {"w": (1,)})
    grid.answers = None  # the baseline has no check-ins to verify
    new, stats = CheckinStrategy(batch_size=4, lr=1.0).run_slots(
        grid,
        FakeJob(),
        fake_protocol("poisson"),
        tasks,
        {"w": np.zeros(1)},
        1,
        torch.Generator(),
        HOSTS,
    )
    assert sorted(grid.asked) == [(5, 1), (5, 2), (5, 4), (26, 1), (27, 4)]
    # one send, one message per worker (client 5 on worker 0 named in 3 slots; 26, 27 on 1)
    assert stats["updates"] == 5 and stats["skipped"] == 1 and grid.calls == 1
    assert grid.messages == [2]
    # one step: mean of the slot means (15.5, 5, 16) over the 3 non-empty slots
    assert new["w"][0] == pytest.approx(-(15.5 + 5 + 16) / 3, abs=1e-12)


def test_worker_answers_each_clients_own_checkin_and_refuses_other_slots(
    task_identity: None,
) -> None:
    plan, algo = prepare(_cfg(["num_clients=10", "client.num_slots=5"]))
    ctx = Context(
        run_id=1, node_id=3, node_config={"partition-id": 0}, state=RecordDict(), run_config={}
    )
    hosted = [2, 3, 4]
    query = Message(
        content=RecordDict(
            {
                CHECKIN_KEY: ConfigRecord({"server_round": 1, "variant": "fixed", "num_slots": 5}),
                "config": ConfigRecord({"server_round": 1, "clients": hosted}),
            }
        ),
        dst_node_id=3,
        message_type=MessageType.QUERY,
    )
    query_handler = algo.message_handler(MessageKind.QUERY)
    assert query_handler is not None
    rec = query_handler(plan, query, ctx).content.config_records[CHECKIN_KEY]
    assert set(rec) == {"clients", "slots", "tickets"}  # occupancy only, no data
    assert list(rec["clients"]) == hosted
    for pid, slot, ticket in zip(hosted, rec["slots"], rec["tickets"], strict=True):
        # each client's own RNG, as a node of its own drew it: slot, then ticket
        rng = checkin_rng(0, 1, pid, False)
        assert slot == draw_checkin(rng, 1.0, (1, 5)) and ticket == int(rng.integers(2**62))
    slots = dict(zip(hosted, rec["slots"], strict=True))
    other = slots[2] % 5 + 1
    from flwr.app import ArrayRecord

    from fedpriv.run.engine import client_rows
    from fedpriv.run.setup import build_model_for

    state = ArrayRecord({k: v.detach() for k, v in build_model_for(plan).state_dict().items()})
    train = Message(
        content=RecordDict(
            {
                "arrays": state,
                "config": ConfigRecord(
                    {"server_round": 1, "clients": [2, 3, 9], "slots": [other, slots[3], 1]}
                ),
            }
        ),
        dst_node_id=3,
        message_type=MessageType.TRAIN,
    )
    slot_handler = algo.message_handler(MessageKind.TRAIN)
    assert slot_handler is not None
    reply = slot_handler(plan, train, ctx)
    rows = client_rows(reply)
    # client 3 sends; client 2 asked for another slot and client 9 (not checked in here) refuse
    assert rows.ids == [3] and list(reply.content.config_records["config"]["slots"]) == [slots[3]]
    assert sorted(rows.errors) == [2, 9] and all("checked into" in e for e in rows.errors.values())
    assert rows.metrics["compute_s"].shape == (1,) and rows.metrics["compute_s"][0] > 0
    # the server treats a refused client as missing: the pass fails (and is accounted in full)

    class OneReply:
        def send_and_receive(self, messages, timeout=None):
            return [reply]

    task = [server.SlotTask(other, (2,)), server.SlotTask(slots[3], (3,))]
    with pytest.raises(RuntimeError, match="1/2 slot updates arrived.*checked into"):
        CheckinStrategy().ask(OneReply(), task, {}, 1, 1.0, {2: 3, 3: 3})


def test_checkin_refuses_a_server_cohort() -> None:
    with pytest.raises(ConfigError) as info:
        prepare(_cfg(["client_sampling=poisson", "client_sample_rate=0.5"]))
    assert "client_sampling='poisson' is not supported with client=checkin" in str(info.value)


# --------------------------------------------------------------------------- randomizers
def _gauss_delta(sigma: float, sens: float, eps: float) -> float:
    """Balle & Wang (2018) Theorem 8, with mpmath: delta of the Gaussian mechanism at eps."""
    mpmath.mp.dps = 40
    a, b = mpmath.mpf(sens) / (2 * sigma), mpmath.mpf(eps) * sigma / sens
    return float(mpmath.ncdf(a - b) - mpmath.exp(eps) * mpmath.ncdf(-a - b))


def test_randomizer_draws_the_noise_scale_it_is_given() -> None:
    """The mechanisms layer's randomizer takes its noise scale as a parameter (the accounting
    calibrates it): Gaussian std = scale, Laplace std = sqrt(2) scale; a scale <= 0 is
    refused."""
    assert LocalRandomizer("gaussian", 0.5, noise_scale=3.0).noise_stddev == 3.0
    lap = LocalRandomizer("laplace", 0.5, noise_scale=2.0)
    assert lap.laplace_scale == 2.0 and lap.noise_stddev == pytest.approx(2.0 * math.sqrt(2))
    assert lap.sensitivity == 1.0  # replace-one: 2L
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ConfigError, match="^noise_scale="):
            LocalRandomizer("gaussian", 0.5, noise_scale=bad)


def test_gaussian_randomizer_noise_has_the_calibrated_std() -> None:
    r = calibrated_randomizer("gaussian", clipping_norm=0.5, local_epsilon=1.0, local_delta=1e-6)
    sigma = analytic_gaussian_sigma(1.0, 1e-6, 1.0)
    assert r.noise_stddev == sigma
    # tight calibration, checked independently (mpmath, Balle & Wang Thm 8): 1e-6 relative
    assert _gauss_delta(sigma, 1.0, 1.0) <= 1e-6 * (1 + 1e-9)
    assert _gauss_delta(sigma * (1 - 1e-6), 1.0, 1.0) > 1e-6
    out = r.randomize({"w": torch.zeros(400_000)}, torch.Generator().manual_seed(0))["w"].double()
    # std error of a sample std over N = 4e5 draws: sigma / sqrt(2N) = 0.11 %; allow 0.6 %
    assert float(out.std()) == pytest.approx(sigma, rel=6e-3)
    assert abs(float(out.mean())) < 5 * sigma / math.sqrt(4e5)


def test_laplace_randomizer_is_l1_clipped_with_scale_2L_over_eps0() -> None:
    r = calibrated_randomizer("laplace", clipping_norm=2.0, local_epsilon=0.5, local_delta=0.0)
    assert r.laplace_scale == 8.0
    clipped = r.clip({"a": torch.tensor([3.0, -4.0]), "b": torch.tensor(5.0)})
    assert sum(float(t.abs().sum()) for t in clipped.values()) == pytest.approx(2.0)
    noise = r.noise({"w": (400_000,)}, torch.Generator().manual_seed(1))["w"].double()
    # Laplace(b): E|X| = b, std = sqrt(2) b; standard errors about 0.16 % and 0.35 %; allow 1 %
    assert float(noise.abs().mean()) == pytest.approx(8.0, rel=1e-2)
    assert float(noise.std()) == pytest.approx(math.sqrt(2) * 8.0, rel=1e-2)


def test_dummy_is_the_randomizer_on_no_data() -> None:
    r = calibrated_randomizer("laplace", clipping_norm=1.0, local_epsilon=1.0, local_delta=0.0)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    zero = r.randomize({"w": torch.zeros(10)}, g1)["w"]
    dummy = r.noise({"w": (10,)}, g2)["w"]
    assert torch.equal(zero, dummy)


# --------------------------------------------------------------------------- accounting
def test_pass_event_matches_the_engine_and_theorem_3_2() -> None:
    spec = CheckinSpec(
        variant="fixed",
        num_slots=1000,
        local_epsilon=1.0,
        checkin_probability=0.5,
        num_clients=1000,
    )
    event = spec.round_events()[0][0]
    assert event == CheckinEvent("fixed", 1.0, 1000, 1000, 0.5, 0.0)
    # Theorem 3.2 by hand:
    # p0 (e^e0 - 1) sqrt(2 e^e0 ln(1/delta) / m) + p0^2 e^e0 (e^e0 - 1)^2 / (2m)
    e0, p0, m, d = 1.0, 0.5, 1000, 1e-6
    thm = p0 * math.expm1(e0) * math.sqrt(
        2 * math.e * math.log(1 / d) / m
    ) + p0**2 * math.e * math.expm1(e0) ** 2 / (2 * m)
    assert thm == pytest.approx(0.2364594, abs=1e-6)  # 0.235455 + 0.001003, by hand
    assert event.epsilon(d) <= thm * (1 + 1e-12)


def test_poisson_baseline_single_step_closed_form() -> None:
    # one step, pure eps0: delta(eps) = q (e^e0 - e^eps) / (1 + e^e0)
    #   =>  eps = ln(e^e0 - delta (1 + e^e0) / q)
    q, e0, delta = 0.01, 1.0, 1e-6
    expected = math.log(math.exp(e0) - delta * (1 + math.exp(e0)) / q)
    assert PoissonLocalEvent(e0, q, steps=1).epsilon(delta) == pytest.approx(expected, rel=1e-8)


def test_poisson_baseline_gaussian_mixture_matches_mpmath() -> None:
    # T = 20 steps at q = 0.1 of a Gaussian randomizer with mu = 2L/sigma = 0.8: the target's
    # reports K ~ Binomial(20, 0.1) and given K = k the release is G_{sqrt(k) mu}
    q, steps, mu, delta = 0.1, 20, 0.8, 1e-5
    eps = PoissonLocalEvent(1.0, q, steps=steps, mu=mu).epsilon(delta)
    mpmath.mp.dps = 40

    def gdp(e: float, m: float) -> mpmath.mpf:
        return mpmath.ncdf(-e / m + m / 2) - mpmath.exp(e) * mpmath.ncdf(-e / m - m / 2)

    def mix(e: float) -> float:
        return float(
            sum(
                mpmath.binomial(steps, k)
                * mpmath.mpf(q) ** k
                * (1 - mpmath.mpf(q)) ** (steps - k)
                * gdp(e, math.sqrt(k) * mu)
                for k in range(1, steps + 1)
            )
        )

    # the engine charges the Binomial tail beyond k_max (<= 1e-3 delta): exact delta within that
    assert delta * (1 - 2e-3) <= mix(eps) <= delta * (1 + 1e-6)


def test_local_epsilon_is_the_randomizers_own() -> None:
    spec = CheckinSpec(variant="fixed", num_slots=10, local_epsilon=2.0, num_clients=10)
    ((ev, count),) = spec.local_events()
    # pure Laplace: eps at any delta <= eps0, and > eps0 - 0.05 at delta = 1e-6 (PLD grid)
    assert 1.95 < ev.epsilon(1e-6, count) <= 2.0 + 1e-6
    assert spec.report(1) == {"local_epsilon0": 2.0}


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["privacy.checkin_probability=0"], "privacy.checkin_probability=0.0 must be in (0, 1]"),
        # non-finite values: the spec names the field and its range (no union config left)
        (["privacy.local_delta=nan"], "privacy.local_delta=nan must be a finite number in [0, 1)"),
        (["privacy.clipping_norm=inf"], "privacy.clipping_norm=inf must be a finite number > 0"),
        (
            ["privacy.checkin_probability=nan"],
            "privacy.checkin_probability=nan must be a finite number in (0, 1]",
        ),
        (["privacy.local_epsilon=inf"], "privacy.local_epsilon=inf must be a finite number > 0"),
        (["privacy.checkin_probability=1.5"], "privacy.checkin_probability=1.5 must be in (0, 1]"),
        (
            ["client.variant=averaged", "privacy.checkin_probability=0.5"],
            "privacy.checkin_probability=0.5 must be 1: Theorem 4.1",
        ),
        (["client.num_slots=0"], "client.num_slots=0 must be an integer >= 1"),
        (
            ["num_clients=5", "client.variant=sliding-window", "client.num_slots=6"],
            "client.num_slots=6 must be <= num_clients=5",
        ),
        (["privacy.local_epsilon=0"], "privacy.local_epsilon=0.0 must be > 0"),
        (["privacy.local_epsilon=-1"], "privacy.local_epsilon=-1.0 must be > 0"),
        (
            ["client.randomizer=gaussian", "privacy.local_delta=0.01"],
            "privacy.local_delta=0.01 violates",
        ),
        (
            ["client.randomizer=laplace", "privacy.local_delta=1e-9"],
            "privacy.local_delta=1e-09 must be 0",
        ),
        (
            ["+client.window=[0,200]", "client.num_slots=100"],
            "client.window=[0, 200] lies outside the run's slots",
        ),
        (["+client.window=[1,50]", "client.num_slots=100"], "cover only R_j = [m]"),
        (
            ["+privacy.noise_multiplier=1.0"],  # the family has no noise_multiplier
            "privacy.noise_multiplier=1.0 is not a setting of privacy=checkin (its keys: ",
        ),
        (
            ["privacy.target_epsilon=1.0"],  # local_epsilon (1.0 by default) and a target
            "privacy.local_epsilon=1.0 and privacy.target_epsilon=1.0: give exactly one",
        ),
    ],
)
def test_bad_input_is_one_clear_line(overrides: list[str], message: str) -> None:
    fixed = [o.replace("+client.window", "client.window") for o in overrides]
    with pytest.raises(ConfigError) as info:
        prepare(_cfg(fixed))
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["privacy.noise_multiplier=1.0"],
            "fedpriv: error: privacy.noise_multiplier='1.0' is not a setting of privacy=checkin "
            "(its keys: accountant, checkin_probability, clipping_norm, ",
        ),
        (
            ["client.client_sample_rate=0.1"],
            "fedpriv: error: client.client_sample_rate='0.1' was renamed (client=checkin "
            "client.variant=poisson: the per-slot client rate): use client.slot_sample_rate",
        ),
    ],
)
def test_command_line_refuses_keys_the_family_does_not_take(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fedpriv client=checkin privacy.noise_multiplier=1.0`` (no ``+``: Hydra refuses the
    key) names the family's keys; the old per-slot rate key names its new one."""
    from fedpriv.cli.experiment import precheck

    with pytest.raises(SystemExit) as info:
        precheck([*BASE, *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(message), err


def test_calibrating_eps0_to_a_central_target() -> None:
    overrides = ["privacy.local_epsilon=null", "privacy.target_epsilon=1.0"]
    plan, algo = prepare(_cfg(["num_clients=100", "client.num_slots=100", *overrides]))
    eps = algo.privacy.pass_event().epsilon(1e-6, 20)  # num_rounds=20 passes (RunConfig)
    assert (
        eps <= 1.0 and eps > 0.98
    )  # the largest eps0 meeting the target, to the bisection's precision
    assert plan.privacy.local_epsilon == algo.privacy.local_epsilon is not None
    assert plan.privacy.calibrated_from_target_epsilon == 1.0


# --------------------------------------------------------------------------- Flower runs
SMALL = [
    "num_clients=5",
    "num_rounds=2",
    "client.num_slots=4",
    "progress=false",
    "plot=false",
    "save_model=false",
    "ray_init_args.num_cpus=2",
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("variant", "extra"),
    [
        ("fixed", ["privacy.checkin_probability=0.8", "strategy.batch_size=2"]),
        ("averaged", []),
        ("sliding-window", ["client.num_slots=3"]),
        ("poisson", []),
    ],
)
def test_short_flower_run(tmp_path: Path, variant: str, extra: list[str]) -> None:
    summary = run_experiment(_cfg([*SMALL, f"client.variant={variant}", *extra]), tmp_path)
    res = json.loads((tmp_path / "results.json").read_text())
    assert summary["status"] == res["status"] == "complete"
    rounds = res["rounds"]
    assert [r["server_round"] for r in rounds] == [1, 2]
    _, algo = prepare(_cfg([*SMALL, f"client.variant={variant}", *extra]))
    # the reported epsilon is the engine's value for 2 passes of the run's parameters
    event = algo.privacy.pass_event()
    assert res["privacy"]["epsilon"] == pytest.approx(event.epsilon(1e-6, 2), rel=1e-12)
    assert rounds[0]["epsilon"] == pytest.approx(event.epsilon(1e-6, 1), rel=1e-12)
    # results.json says which bound answered after the run's 2 passes, and the normalizer
    assert res["privacy"]["normalizer"] == 1.0
    assert res["privacy"]["bound"] == algo.privacy.bound_after(2).bound
    assert res["privacy"].get("bound_reason") == algo.privacy.bound_after(2).reason
    n, m = 5, algo.num_slots
    for r in rounds:
        assert r["slots"] == len(update_slots(variant, m, n))
        empty = r.get("dummies", r.get("skipped"))
        assert 0 <= empty <= r["slots"] and len(r["block_accuracy"]) >= 1
        if variant != "poisson":
            p0 = algo.privacy.checkin_probability
            exp = expected_dummy_updates(variant, n, m, p0)["expected"]
            assert r.get("expected_dummies", r.get("expected_skipped")) == pytest.approx(exp)
        if variant in ("fixed", "sliding-window"):  # one update per occupied slot
            assert r["updates_used"] + r["dummies"] == r["slots"]
