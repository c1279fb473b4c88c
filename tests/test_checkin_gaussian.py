"""Issue 13: random check-ins as participation with central Gaussian noise on each slot's sum.

References independent of fedpriv's mapping:
- brute force: the exact hockey-stick divergence of one pass on tiny cases (m = 2 slots,
  p0 in {1, 0.5}; 2-d numerical integration of the output densities), of which the reported
  ε must be an upper bound and within 5 %;
- pld-accounting's random-allocation PLD for p0 = 1 (the same mechanism, no subsampling).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import optimize, stats

from fedpriv.accounting import cli
from fedpriv.accounting.allocation import RandomAllocationEvent
from fedpriv.accounting.checkin_gaussian import (
    ALLOCATION_BOUND,
    THEOREM_BOUND,
    CheckinGaussianEvent,
    CheckinGaussianSpec,
)
from fedpriv.accounting.spec import AccountingSpec
from fedpriv.errors import ConfigError


def checkin_exact_delta(sigma: float, p0: float, eps: float) -> float:
    """One pass, m = 2 slots, scalar clipped update C = 1, add/remove, the others' sums
    subtracted: Q = N(0, σ²I₂) without the client, P = (1 − p0) Q + p0 (½ N((1,0), σ²I) +
    ½ N((0,1), σ²I)) with it; max over both directions of ∫ max(0, p − e^ε q), by a
    1601² Riemann sum over [−10σ − 1, 10σ + 2]² (grid error < 1e-6 in δ at σ = 1)."""
    s2 = sigma**2
    g = np.linspace(-10 * sigma - 1, 10 * sigma + 2, 1601)
    y1, y2 = np.meshgrid(g, g, indexing="ij")
    cell = (g[1] - g[0]) ** 2
    qd = stats.norm.pdf(y1, 0, sigma) * stats.norm.pdf(y2, 0, sigma)
    a, b = (2 * y1 - 1) / (2 * s2), (2 * y2 - 1) / (2 * s2)
    alloc = qd * np.exp(np.logaddexp(a, b) - math.log(2))
    pd = (1 - p0) * qd + p0 * alloc
    remove = float(np.sum(np.maximum(pd - math.exp(eps) * qd, 0)) * cell)
    add = float(np.sum(np.maximum(qd - math.exp(eps) * pd, 0)) * cell)
    return max(remove, add)


def exact_epsilon(sigma: float, p0: float, delta: float) -> float:
    """Smallest ε with exact δ(ε) <= ``delta`` (brentq to 1e-6 on a decreasing function)."""
    return float(
        optimize.brentq(lambda e: checkin_exact_delta(sigma, p0, e) - delta, 0.0, 50.0, xtol=1e-6)
    )


def spec(z: float = 1.0, m: int = 2, p0: float = 1.0, delta: float = 1e-3) -> CheckinGaussianSpec:
    return CheckinGaussianSpec(
        noise_multiplier=z,
        num_slots=m,
        checkin_probability=p0,
        accounting=AccountingSpec(target_delta=delta),
    )


@pytest.mark.parametrize("p0", [1.0, 0.5])
def test_one_pass_is_an_upper_bound_of_the_exact_tiny_case_within_5_percent(p0: float) -> None:
    """m = 2, σ = 1, δ = 1e-3: exact ε <= reported ε <= 1.05 exact ε (measured: 2.4958 vs
    2.4970 at p0 = 1, 1.6867 vs 1.6878 at p0 = 0.5). Checking in with p0 = 0.5 must cost
    strictly less than p0 = 1 (so a p0 that were ignored would fail the upper bound tightness
    at p0 = 0.5: 2.497 > 1.05 x 1.687)."""
    exact = exact_epsilon(1.0, p0, 1e-3)
    ours = spec(p0=p0).epsilon(1)
    assert exact <= ours <= 1.05 * exact


def test_p0_one_is_random_allocation_and_passes_compose_by_self_composition() -> None:
    """p0 = 1: one pass is exactly the k = 1, t = m random allocation (same PLD, rel. 1e-12);
    p0 = 0.5, 3 passes: the ledger's ε equals the pass PLD self-composed 3 times (rel. 1e-9),
    more than one pass and at most 3 x one pass (basic composition)."""
    full = spec(z=1.5, m=5, p0=1.0, delta=1e-5)
    alloc = RandomAllocationEvent(1.5, num_steps=5, num_selected=1)
    assert full.epsilon(1) == pytest.approx(alloc.epsilon(1e-5), rel=1e-12)
    half = spec(z=1.5, m=5, p0=0.5, delta=1e-5)
    ev = CheckinGaussianEvent(1.5, 5, 0.5)
    direct = ev.pld().self_compose(3).get_epsilon_for_delta(1e-5)
    e1, e3 = half.epsilon(1), half.epsilon(3)
    assert e3 == pytest.approx(direct, rel=1e-9)
    assert e1 < e3 <= 3 * e1
    assert e1 < full.epsilon(1)


def test_both_routes_are_visible_and_the_theorem_is_not_claimed() -> None:
    """The summary names the route that answered, shows every route's ε (the theorem's as
    None, with its reason) and the add/remove relation."""
    s = spec(z=1.0, m=4, p0=0.5, delta=1e-5)
    out = s.summary(2)
    assert out["bound"] == ALLOCATION_BOUND
    assert out["epsilon_by_bound"][ALLOCATION_BOUND] == pytest.approx(s.epsilon(2), rel=1e-12)
    assert out["epsilon_by_bound"][THEOREM_BOUND] is None
    assert out["bound_reason"][THEOREM_BOUND].startswith("not applicable")
    assert out["neighboring_relation"] == "add_remove"
    assert out["noise_stddev"] == 1.0


def test_cli_epsilon_of_passes_matches_the_spec() -> None:
    r = cli.run(
        "checkin",
        {
            "noise": "central_gaussian",
            "noise_multiplier": "1.2",
            "num_slots": "4",
            "checkin_probability": "0.5",
            "num_clients": "20",
            "repetitions": "3",
            "target_delta": "1e-5",
        },
    )
    assert r["epsilon"] == pytest.approx(spec(1.2, 4, 0.5, 1e-5).epsilon(3), rel=1e-12)
    assert r["delta"] == 1e-5 and r["bound"] == ALLOCATION_BOUND
    assert r["expected_empty_slots"] == pytest.approx(4 * (1 - 0.5 / 4) ** 20, rel=1e-12)


def test_cli_calibration_meets_the_target_within_one_percent() -> None:
    """target ε = 2 after 3 passes of m = 4, p0 = 0.5: calibrated σ gives 0.99·2 <= ε <= 2."""
    r = cli.run(
        "checkin",
        {
            "noise": "central_gaussian",
            "target_epsilon": "2",
            "num_slots": "4",
            "checkin_probability": "0.5",
            "repetitions": "3",
            "target_delta": "1e-5",
        },
    )
    assert r["calibrated"] == "noise_multiplier"
    eps = spec(r["noise_multiplier"], 4, 0.5, 1e-5).epsilon(3)
    assert 0.99 * 2.0 <= eps <= 2.0
    assert r["epsilon"] == pytest.approx(eps, rel=1e-12)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"variant": "averaged"}, "variant"),
        ({"accountant": "rdp"}, "accountant"),
        ({"noise": "local"}, "noise"),
        ({"noise_multiplier": "0"}, "noise_multiplier"),
        ({"checkin_probability": "1.5"}, "checkin_probability"),
        ({"bogus": "1"}, "bogus"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(
    extra: dict[str, str], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args: dict[str, Any] = {
        "noise": "central_gaussian",
        "noise_multiplier": "1",
        "num_slots": "4",
        **extra,
    }
    with pytest.raises(ConfigError) as err:
        cli.run("checkin", args)
    assert err.value.field == field
    argv = ["checkin"] + [f"{k}={v}" for k, v in args.items()]
    assert cli.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and field in lines[0]
