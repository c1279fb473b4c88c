"""Random check-in theorems evaluated by hand (mpmath), composition, dummies, refusals."""

from __future__ import annotations

import itertools
import json
import math

import mpmath as mp
import numpy as np
import pytest
from dp_accounting.pld import common, privacy_loss_distribution
from hypothesis import given, settings
from hypothesis import strategies as st

from fedpriv.accounting.accountants.composition import (
    advanced_composition_epsilon,
    optimal_composition_delta,
)
from fedpriv.accounting.checkin.events import CheckinEvent
from fedpriv.accounting.core.ledger import PrivacyLedger
from fedpriv.accounting.samplers.checkin import (
    VARIANTS,
    delta0_bound,
    expected_dummy_updates,
    min_delta1,
    pure_epsilon,
)
from fedpriv.accounting.samplers.shuffle import shuffle_epsilon
from fedpriv.cli.account import run as account
from fedpriv.common.errors import ConfigError

mp.mp.dps = 40
E = mp.e


# --------------------------------------------------------------------------- hand formulas
# Transcribed from ../shared/papers/random-check-ins.txt, independently of the module.
def hand_fixed(e0, n, m, p0, d):  # Theorem 3.2
    e0 = mp.mpf(e0)
    return p0 * (E**e0 - 1) * mp.sqrt(2 * E**e0 * mp.log(1 / mp.mpf(d)) / m) + p0**2 * E**e0 * (
        E**e0 - 1
    ) ** 2 / (2 * m)


def hand_fixed_approx(e0, n, m, p0, d):  # Theorem 3.2, (eps0, delta0) form as printed
    e0 = mp.mpf(e0)
    return p0**2 * E ** (8 * e0) * (E ** (8 * e0) - 1) ** 2 / (2 * m) + p0 * (
        E ** (8 * e0) - 1
    ) * mp.sqrt(2 * E ** (8 * e0) * mp.log(1 / mp.mpf(d)) / m)


def hand_eps1(n, m, d2):
    return mp.sqrt(mp.mpf(1) / n + mp.mpf(1) / m) + mp.sqrt(mp.log(1 / mp.mpf(d2)) / n)


def hand_averaged_approx(e0, n, m, d, d2):  # Theorem 4.1, (eps0, delta0) form as printed
    e0, e1 = mp.mpf(e0), hand_eps1(n, m, d2)
    return E ** (32 * e0) * (E ** (8 * e0) - 1) ** 2 * e1**2 / 2 + E ** (16 * e0) * (
        E ** (8 * e0) - 1
    ) * e1 * mp.sqrt(2 * mp.log(1 / mp.mpf(d)))


def hand_sliding(e0, n, m, d):  # Theorem 4.3
    e0 = mp.mpf(e0)
    return E**e0 * (E**e0 - 1) ** 2 / (2 * m) + (E**e0 - 1) * mp.sqrt(
        2 * E**e0 * mp.log(1 / mp.mpf(d)) / m
    )


def hand_shuffle(e0, n, d):  # Theorem 5.1
    e0 = mp.mpf(e0)
    return E ** (3 * e0) * (E**e0 - 1) ** 2 / (2 * n) + E ** (3 * e0 / 2) * (E**e0 - 1) * mp.sqrt(
        2 * mp.log(1 / mp.mpf(d)) / n
    )


def hand_shuffle_approx(e0, n, d):  # Theorem 5.1, (eps0, delta0) form as printed
    e0 = mp.mpf(e0)
    return E ** (24 * e0) * (E ** (8 * e0) - 1) ** 2 / (2 * n) + E ** (12 * e0) * (
        E ** (8 * e0) - 1
    ) * mp.sqrt(2 * mp.log(1 / mp.mpf(d)) / n)


def hand_delta0_bound(e0, d1):
    e0, d1 = mp.mpf(e0), mp.mpf(d1)
    return (1 - E**-e0) * d1 / (4 * E**e0 * (2 + mp.log(2 / d1) / mp.log(1 / (1 - E ** (-5 * e0)))))


SETS = [(0.5, 10_000, 1_000, 0.5, 1e-6), (2.0, 500, 100, 1.0, 1e-8)]


# --------------------------------------------------------------------------- pure theorems
@pytest.mark.parametrize("e0, n, m, p0, d", SETS)
def test_pure_theorems_by_hand(e0: float, n: int, m: int, p0: float, d: float) -> None:
    # tolerance: 1e-12 relative (closed forms in double vs 40-digit mpmath)
    for ev, hand in [
        (CheckinEvent("fixed", e0, n, m, p0), hand_fixed(e0, n, m, p0, d)),
        (CheckinEvent("sliding-window", e0, n, m), hand_sliding(e0, n, m, d)),
        (CheckinEvent("shuffle", e0, n), hand_shuffle(e0, n, d)),
    ]:
        assert ev.pass_epsilon(d) == pytest.approx(float(hand), rel=1e-12)  # the theorem itself
        # reported: never above eps0 (one eps0-DP report per client and pass); shuffle also
        # takes the FMT21 numerical bound when smaller (tests/test_shuffle_bound.py)
        want = min(float(hand), e0)
        if ev.uses_fmt:
            want = min(want, shuffle_epsilon(n, e0, d))
        assert ev.epsilon(d) == pytest.approx(want, rel=1e-12)


def test_averaged_reconstruction_is_consistent_with_printed_form() -> None:
    # The pure form is reconstructed; evaluated at 8 eps0 it must be the printed form.
    for e0, n, m, d, d2 in [(0.05, 10_000, 1_000, 1e-6, 1e-7), (0.1, 2_000, 500, 1e-8, 1e-9)]:
        got = pure_epsilon("averaged", 8 * e0, n, m, d, 1.0, d2)
        assert got == pytest.approx(float(hand_averaged_approx(e0, n, m, d, d2)), rel=1e-12)
    # pure, delta2 given: total delta is delta + delta2 (Theorem 4.1)
    ev = CheckinEvent("averaged", 0.5, 10_000, 1_000, delta2=1e-7)
    want = pure_epsilon("averaged", 0.5, 10_000, 1_000, 1e-6, 1.0, 1e-7)
    assert ev.pass_epsilon(1e-6 + 1e-7) == pytest.approx(want, rel=1e-12)
    # the paper: averaging costs at least as much as the fixed window (extra e^{3eps0/2})
    for e0 in [0.1, 0.5, 1.0, 2.0]:
        assert CheckinEvent("averaged", e0, 5000, 1000).epsilon(1e-6) >= CheckinEvent(
            "fixed", e0, 5000, 1000
        ).epsilon(1e-6)


@settings(max_examples=50, deadline=None)
@given(
    e0=st.floats(0.01, 1.0),
    d=st.floats(1e-12, 1e-2),
    m=st.integers(1, 100_000),
    p0=st.floats(0.01, 1.0),
)
def test_papers_simplified_bound_holds(e0: float, d: float, m: int, p0: float) -> None:
    # Theorem 3.2 / 4.3: for eps0 <= 1 and delta <= 1/100, eps <= 7 p0 eps0 sqrt(log(1/d)/m).
    bound = 7 * p0 * e0 * math.sqrt(math.log(1 / d) / m)
    assert pure_epsilon("fixed", e0, 10 * m, m, d, p0) <= bound * (1 + 1e-12)
    assert pure_epsilon("sliding-window", e0, 10 * m, m, d) <= 7 * e0 * math.sqrt(
        math.log(1 / d) / m
    ) * (1 + 1e-12)


# --------------------------------------------------------------------------- (eps0, delta0)
def test_delta0_bound_by_hand() -> None:
    for e0, d1 in [(0.05, 1e-9), (1.0, 1e-12), (3.0, 1e-6)]:
        # tolerance: 1e-12 relative
        assert delta0_bound(e0, d1) == pytest.approx(float(hand_delta0_bound(e0, d1)), rel=1e-12)
    d1 = min_delta1(0.5, 1e-15)
    assert delta0_bound(0.5, d1) >= 1e-15
    assert delta0_bound(0.5, d1 * (1 - 1e-6)) < 1e-15


def test_approx_fixed_window_by_hand() -> None:
    e0, n, m, p0, d, d1 = 0.05, 10_000, 1_000, 0.5, 1e-6, 1e-9
    d0 = 0.7 * float(hand_delta0_bound(e0, d1))
    eps_hand = hand_fixed_approx(e0, n, m, p0, d)
    total = float(d + m * (E**eps_hand + 1) * d1)
    ev = CheckinEvent("fixed", e0, n, m, p0, local_delta=d0, delta1=d1)
    # the split (d, d1) is feasible, so the engine's optimum is at most the hand value and,
    # being the optimum of a smooth trade-off, within 1e-9 of it
    assert ev.epsilon(total) <= float(eps_hand) * (1 + 1e-12)
    assert ev.epsilon(total) == pytest.approx(float(eps_hand), rel=1e-9)


def test_approx_shuffle_by_hand() -> None:
    e0, n, d, d1 = 0.02, 100_000, 1e-7, 1e-13
    d0 = float(hand_delta0_bound(e0, d1))
    eps_hand = hand_shuffle_approx(e0, n, d)
    total = float(d + n * (E**eps_hand + 1) * d1)  # K = n for Theorem 5.1
    ev = CheckinEvent("shuffle", e0, n, local_delta=d0, delta1=d1)
    assert ev.epsilon(total) <= float(eps_hand) * (1 + 1e-12)
    assert ev.epsilon(total) == pytest.approx(float(eps_hand), rel=1e-9)


def test_pure_is_the_delta0_zero_case() -> None:
    # the pure theorem is the special case delta0 = 0 (no 8x, no delta1 term), and the
    # (eps0, delta0) form is never better than the pure one at the same total delta
    for variant, kw in [
        ("fixed", {"num_slots": 1000, "checkin_probability": 0.3}),
        ("sliding-window", {"num_slots": 1000}),
        ("shuffle", {}),
    ]:
        pure = CheckinEvent(variant, 0.05, 50_000, **kw)
        approx = CheckinEvent(variant, 0.05, 50_000, local_delta=1e-20, **kw)
        assert pure.pass_epsilon(1e-6) < approx.pass_epsilon(1e-6)  # the theorems themselves
        e8 = pure_epsilon(
            variant,
            0.4,
            50_000,
            kw.get("num_slots", 50_000),
            1e-6,
            kw.get("checkin_probability", 1.0),
        )
        assert approx.pass_epsilon(1e-6) >= e8


def test_precondition_refused_with_reason() -> None:
    with pytest.raises(ConfigError, match=r"^local_delta=0.001 violates the precondition"):
        CheckinEvent("fixed", 1.0, 1000, 100, local_delta=1e-3, delta1=1e-6)
    with pytest.raises(ConfigError, match="^local_delta="):
        CheckinEvent("shuffle", 0.01, 1000, local_delta=0.5)
    # no split of target_delta makes the theorem apply here, but eps0 itself still holds
    out = account(
        "checkin",
        {
            "variant": "shuffle",
            "local_epsilon": "0.5",
            "local_delta": "1e-15",
            "num_clients": "100000",
            "target_delta": "1e-6",
        },
    )
    assert out["epsilon"] == 0.5 and out["composition"].startswith("local")


# --------------------------------------------------------------------------- composition
def brute_composed_delta(eps: float, delta: float, k: int, eps_g: float) -> float:
    """Hockey stick of k copies of the canonical (eps, delta) pair, by enumeration."""
    a = math.exp(eps) / (1 + math.exp(eps))
    p = [delta, (1 - delta) * a, (1 - delta) * (1 - a), 0.0]
    q = [0.0, (1 - delta) * (1 - a), (1 - delta) * a, delta]
    total = 0.0
    for out in itertools.product(range(4), repeat=k):
        pp = math.prod(p[o] for o in out)
        qq = math.prod(q[o] for o in out)
        total += max(pp - math.exp(eps_g) * qq, 0.0)
    return total


@pytest.mark.parametrize("k", [1, 2, 3, 5, 6])
def test_optimal_composition_against_enumeration(k: int) -> None:
    for eps, delta, eps_g in [(0.3, 1e-4, 0.5), (1.0, 1e-6, 1.7), (0.1, 0.0, 0.05)]:
        want = brute_composed_delta(eps, delta, k, eps_g)
        # tolerance: 1e-10 relative (4^k-term enumeration)
        assert optimal_composition_delta(eps, delta, k, eps_g) == pytest.approx(
            want, rel=1e-10, abs=1e-300
        )


def test_optimal_composition_against_dp_accounting_pld() -> None:
    eps, delta, k = 0.2, 1e-7, 50
    pld = privacy_loss_distribution.from_privacy_parameters(
        common.DifferentialPrivacyParameters(eps, delta), value_discretization_interval=1e-4
    )
    composed = pld.self_compose(k)
    for eps_g in [1.0, 2.0, 3.0]:
        ours = optimal_composition_delta(eps, delta, k, eps_g)
        theirs = composed.get_delta_for_epsilon(eps_g)
        # PLD is pessimistic: ours <= theirs, within 2e-2 relative at this grid
        assert ours <= theirs * (1 + 1e-9)
        assert ours == pytest.approx(theirs, rel=2e-2)


def test_repetitions_best_of_compositions() -> None:
    ev = CheckinEvent("fixed", 1.0, 100_000, 1_000, checkin_probability=0.01)
    reps = 100  # Corollary 3.3: n/m repetitions with p0 = m/n
    eps, method = ev.epsilon_and_method(1e-6, reps)
    assert method in ("advanced", "optimal", "basic")
    for frac in [0.1, 0.5]:
        d_pass = frac * 1e-6 / reps
        e1 = ev.pass_epsilon(d_pass)
        assert eps <= advanced_composition_epsilon(e1, reps, 1e-6 - reps * d_pass) + 1e-12
    assert eps <= reps * ev.pass_epsilon(1e-6 / reps) + 1e-12
    assert eps > ev.epsilon(1e-6)


# --------------------------------------------------------------------------- dummy updates
def test_expected_dummies_fixed_monte_carlo() -> None:
    n, m, p0, trials = 200, 50, 0.3, 20_000
    rng = np.random.default_rng(7)
    on = rng.random((trials, n)) < p0
    slot = rng.integers(0, m, (trials, n))
    flat = (np.arange(trials)[:, None] * m + slot)[on]
    empty = m - (np.bincount(flat, minlength=trials * m).reshape(trials, m) > 0).sum(axis=1)
    exp = expected_dummy_updates("fixed", n, m, p0)
    assert exp["expected"] == pytest.approx(m * (1 - p0 / m) ** n, rel=1e-12)
    # Monte Carlo: within 5 standard errors (fixed seed)
    assert abs(empty.mean() - exp["expected"]) < 5 * empty.std() / math.sqrt(trials)
    assert exp["expected"] <= m / math.exp(p0 * n / m) + 1e-12  # m / e^c with p0 = c m / n


def test_expected_dummies_sliding_window_monte_carlo() -> None:
    n, m, trials = 300, 20, 5_000
    rng = np.random.default_rng(11)
    slot = np.arange(n)[None, :] + rng.integers(0, m, (trials, n))  # client j: {j..j+m-1}
    served = np.arange(m - 1, n)  # n - m + 1 server updates from time m on (0-based m-1)
    occupied = np.zeros((trials, n + m), dtype=bool)
    occupied[np.arange(trials)[:, None], slot] = True
    empty = (~occupied[:, served]).sum(axis=1)
    exp = expected_dummy_updates("sliding-window", n, m)
    assert abs(empty.mean() - exp["expected"]) < 5 * empty.std() / math.sqrt(trials)
    assert exp["expected"] <= exp["bound"] == pytest.approx((n - m + 1) / math.e)


# --------------------------------------------------------------------------- refusals, CLI
@pytest.mark.parametrize(
    "params, key",
    [
        ({"variant": "averaged", "checkin_probability": "0.5"}, "checkin_probability"),
        ({"variant": "sliding-window", "num_slots": "2000"}, "num_slots"),
        ({"variant": "fixed", "local_epsilon": "0"}, "local_epsilon"),
        ({"variant": "fixed", "checkin_probability": "1.5"}, "checkin_probability"),
        ({"variant": "fixed", "delta2": "1e-7"}, "delta2"),
        ({"variant": "nope"}, "variant"),
        ({"variant": "fixed", "target_delta": "1"}, "target_delta"),
        ({"variant": "fixed", "typo": "1"}, "typo"),
    ],
)
def test_cli_refusals_name_the_key(params: dict[str, str], key: str) -> None:
    base = {"local_epsilon": "1", "num_clients": "1000", "num_slots": "100", "target_delta": "1e-6"}
    with pytest.raises(ConfigError) as err:
        account("checkin", {**base, **params})
    assert str(err.value).startswith(key + "=")


def test_cli_and_ledger_agree() -> None:
    out = account(
        "checkin",
        {
            "variant": "fixed",
            "local_epsilon": "1",
            "num_clients": "10000",
            "num_slots": "1000",
            "checkin_probability": "0.1",
            "target_delta": "1e-6",
            "repetitions": "10",
        },
    )
    ev = CheckinEvent("fixed", 1.0, 10_000, 1_000, 0.1)
    ledger = PrivacyLedger(neighboring_relation="replace_one")
    ledger.record(ev, 10)
    assert ledger.get_epsilon(1e-6) == pytest.approx(out["epsilon"], rel=1e-12)
    again = PrivacyLedger.from_dict(json.loads(json.dumps(ledger.to_dict())))
    assert again.get_epsilon(1e-6) == ledger.get_epsilon(1e-6)
    back = account(
        "checkin",
        {
            "variant": "fixed",
            "local_epsilon": "1",
            "num_clients": "10000",
            "num_slots": "1000",
            "checkin_probability": "0.1",
            "target_epsilon": str(out["epsilon"]),
            "repetitions": "10",
        },
    )
    assert ev.epsilon(back["delta"], 10) <= out["epsilon"] + 1e-12
    assert back["delta"] == pytest.approx(1e-6, rel=5e-3)


# --------------------------------------------------------------------------- properties
@pytest.mark.slow  # ~12 s; every variant's golden values and bounds stay in the fast tier
@settings(max_examples=40, deadline=None)
@given(
    variant=st.sampled_from(VARIANTS),
    e0=st.floats(0.01, 3.0),
    n=st.integers(100, 100_000),
    frac=st.floats(0.01, 1.0),
    d=st.floats(1e-12, 1e-3),
    factor=st.floats(1.05, 2.0),
)
def test_monotone_and_never_nan(
    variant: str, e0: float, n: int, frac: float, d: float, factor: float
) -> None:
    m = max(1, int(frac * n))
    ev = CheckinEvent(variant, e0, n, m)
    base = ev.epsilon(d)
    assert not math.isnan(base) and base >= 0  # 0 is valid once delta exceeds TV distance
    assert CheckinEvent(variant, e0 * factor, n, m).epsilon(d) >= base
    if variant != "shuffle" and int(m * factor) + 1 <= n:
        assert CheckinEvent(variant, e0, n, int(m * factor) + 1).epsilon(d) <= base
    if variant in ("shuffle", "averaged"):
        assert CheckinEvent(variant, e0, int(n * factor) + 1, m).epsilon(d) <= base
    assert ev.epsilon(d, 3) >= base
