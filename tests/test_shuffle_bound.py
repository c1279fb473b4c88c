"""FMT21 numerical shuffling bound: reference code's numbers, brute force, monotonicity, CLI.

Reference numbers were computed by running apple/ml-shuffling-amplification (commit 993d285,
``computeamplification.py``) in a scratch directory OUTSIDE this repository:

    mkdir /tmp/fmt && cd /tmp/fmt
    git --git-dir=<mirror of apple/ml-shuffling-amplification> show \
        HEAD:computeamplification.py > computeamplification.py
    sed 's/max(deltaq_upperc, deltaq_upperc)/max(deltaq_upperc, deltaq_lowerc)/' \
        computeamplification.py > ca_fixed.py          # the reference with its typo fixed
    python -c "import computeamplification as CA; \
        print(repr(CA.numericalanalysis(N, EPS0, DELTA, T, 1, UPPER)))"   # step = 1

(``ca_fixed`` in place of ``computeamplification`` for the typo-fixed values). The paper's own
example (the reference README: n = 1e5, eps0 = 4, delta = 1e-6, 10 bisection steps, step 100)
prints lower 0.1675385583317841, upper 0.172790550755978, closed form 0.5378040242374512.
"""

from __future__ import annotations

import contextlib
import io
import json
import math

import mpmath as mp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedpriv.accounting.accountants.composition import compose_repetitions
from fedpriv.accounting.checkin.events import LOCAL_CAP, CheckinEvent
from fedpriv.accounting.samplers import shuffle as sh
from fedpriv.accounting.samplers.checkin import pure_epsilon
from fedpriv.cli.account import main
from fedpriv.common.errors import ConfigError

# (n, eps0, delta, T) -> reference's numericalanalysis(n, eps0, delta, T, step=1, upper=True)
# with the typo fixed (ca_fixed); the unmodified reference gives the same digits except where
# noted (its typo under-states the Q||P term of the first interval).
REFERENCE_UPPER = {
    (10_000, 1.0, 1e-6, 20): 0.055561684182607915,  # unmodified: same
    (1_000, 0.5, 1e-5, 20): 0.062046191076653684,  # unmodified: same
    (2_000, 3.0, 1e-8, 20): 1.0390090942382812,  # unmodified: 1.0388917922973633
    (100_000, 4.0, 1e-6, 10): 0.1769921446953331,  # unmodified: same
}
# numericalanalysis(n, eps0, delta, 20, 1, False) (unmodified reference): the lower bound
REFERENCE_LOWER = {
    (10_000, 1.0, 1e-6): 0.053005403126148556,
    (1_000, 0.5, 1e-5): 0.058265661271585945,
    (2_000, 3.0, 1e-8): 1.013880729675293,
}
# closedformanalysis(n, eps0, delta) of the reference
REFERENCE_CLOSED = {
    (100_000, 4.0, 1e-6): 0.5378040242374512,  # also printed in the reference README
    (10_000, 1.0, 1e-6): 0.2332655961237434,
    (1_000, 0.5, 1e-5): 0.3098220258600004,
    (2_000, 3.0, 1e-8): 3.0,  # outside the closed form's regime: eps0
}


def _cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["checkin", *args])
    return rc, out.getvalue(), err.getvalue()


# --------------------------------------------------------------------------- reference code
@pytest.mark.parametrize(("key", "want"), list(REFERENCE_UPPER.items()))
def test_reference_stopping_rule_reproduces_the_reference(
    key: tuple[int, float, float, int], want: float
) -> None:
    n, e0, d, iters = key
    got = sh.shuffle_epsilon(n, e0, d, iters, early_stop=True)
    # tolerance: 1e-12 relative (same bisection; binomial masses from tails, not 1 - sum)
    assert got == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize(("key", "lower"), list(REFERENCE_LOWER.items()))
def test_default_lies_between_the_reference_bounds(
    key: tuple[int, float, float], lower: float
) -> None:
    n, e0, d = key
    got = sh.shuffle_epsilon(n, e0, d)
    upper = REFERENCE_UPPER[(n, e0, d, 20)]
    # the reference's lower bound is the upper end of its own bisection bracket: up to
    # start x 2^-20 above the lower bound itself
    slack = min(REFERENCE_CLOSED[key], e0) * 2.0**-20
    assert lower - slack <= got <= upper
    # tight: within 5e-4 relative of the lower bound (measured: 8e-7, 7e-5, 2e-4)
    assert got <= lower * (1 + 5e-4)


def test_paper_example_from_the_reference_readme() -> None:
    # n = 1e5, eps0 = 4, delta = 1e-6: lower 0.16754 (README) <= ours <= 0.17699 (step 1)
    got = sh.shuffle_epsilon(100_000, 4.0, 1e-6)
    assert 0.1675385583317841 <= got <= 0.1769921446953331
    assert got == pytest.approx(0.16977, abs=1e-5)  # measured, rounded
    assert sh.closed_form_epsilon(100_000, 4.0, 1e-6) == pytest.approx(
        0.5378040242374512, rel=1e-12
    )


@pytest.mark.parametrize(("key", "want"), list(REFERENCE_CLOSED.items()))
def test_closed_form_matches_the_reference(key: tuple[int, float, float], want: float) -> None:
    assert sh.closed_form_epsilon(*key) == pytest.approx(want, rel=1e-12)  # tolerance 1e-12
    assert sh.shuffle_epsilon(*key) <= want  # the numerical bound is never looser


# --------------------------------------------------------------------------- brute force
def _brute_delta(n: int, e0: float, eps: float) -> float:
    """max(D(P||Q), D(Q||P)) of the clone pair, summed over every (c, x) in 30 digits."""
    mp.mp.dps = 30
    e0m, epsm = mp.mpf(e0), mp.mpf(eps)
    a = mp.e**e0m / (mp.e**e0m + 1)
    p = mp.e**-e0m
    ee = mp.e**epsm
    dp = dq = mp.mpf(0)
    for c in range(n):
        wc = mp.binomial(n - 1, c) * p**c * (1 - p) ** (n - 1 - c)
        sp = sq = mp.mpf(0)
        for x in range(c + 2):
            ax = mp.binomial(c, x) / mp.mpf(2) ** c if x <= c else 0
            bx = mp.binomial(c, x - 1) / mp.mpf(2) ** c if x >= 1 else 0
            pp, qq = a * ax + (1 - a) * bx, (1 - a) * ax + a * bx
            sp += max(0, pp - ee * qq)
            sq += max(0, qq - ee * pp)
        dp += wc * sp
        dq += wc * sq
    return float(max(dp, dq))


@pytest.mark.parametrize(
    ("n", "e0", "eps"), [(30, 0.5, 0.05), (30, 0.5, 0.45), (100, 1.0, 0.2), (60, 3.0, 0.5)]
)
def test_delta_is_an_upper_bound_on_the_brute_force_divergence(
    n: int, e0: float, eps: float
) -> None:
    brute = _brute_delta(n, e0, eps)
    got = sh.shuffle_delta(n, e0, eps)
    # never below (1e-12: double vs 30 digits); above by at most 6% (the reference's first
    # interval {c0, c0 + 1} is charged max(B(c0), B(c0 + 1)); measured 0.1% .. 4.1%)
    assert brute * (1 - 1e-12) <= got <= brute * 1.06


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(2, 30),
    e0=st.floats(0.05, 5.0),
    frac=st.floats(0.0, 0.999),
)
def test_delta_never_below_brute_force_on_tiny_cases(n: int, e0: float, frac: float) -> None:
    eps = frac * e0
    brute = _brute_delta(n, e0, eps)
    got = sh.shuffle_delta(n, e0, eps)
    # validity (1e-12 relative: double vs 30 digits); looseness at most 20% (measured 7.6%
    # worst over 60 random tiny cases)
    assert got >= brute * (1 - 1e-12)
    assert got <= brute * 1.2 + 1e-15


def test_epsilon_is_certified_and_tight() -> None:
    for n, e0, d in [(10_000, 1.0, 1e-6), (500, 2.0, 1e-8), (50_000, 0.2, 1e-10)]:
        eps = sh.shuffle_epsilon(n, e0, d)
        assert sh.shuffle_delta(n, e0, eps) < d  # the returned end of the bracket holds
        # a little below it the bound no longer certifies delta (bisection width 2^-24 start)
        assert sh.shuffle_delta(n, e0, eps - 2.0 * e0 * 2.0**-24) >= d * (1 - 1e-6)


def test_one_report_is_not_amplified() -> None:
    # n = 1: no clones, the shuffled output is the report itself (the reference returns ~0
    # here: its loop over c is empty)
    assert sh.shuffle_epsilon(1, 0.7, 1e-6) == 0.7
    # pure 0.7-DP alone: delta(0.3) <= 1 - e^{0.3 - 0.7} (tolerance 1e-15)
    assert sh.shuffle_delta(1, 0.7, 0.3) == pytest.approx(1 - math.exp(-0.4), rel=1e-15)


# --------------------------------------------------------------------------- monotonicity
def test_monotone_in_n_and_eps0() -> None:
    by_n = [sh.shuffle_epsilon(n, 1.0, 1e-6) for n in (100, 300, 1_000, 3_000, 10_000, 30_000)]
    assert all(a > b for a, b in zip(by_n, by_n[1:], strict=False))
    by_e0 = [sh.shuffle_epsilon(5_000, e0, 1e-6) for e0 in (0.05, 0.2, 0.5, 1.0, 2.0, 4.0)]
    assert all(a < b for a, b in zip(by_e0, by_e0[1:], strict=False))
    assert all(e <= e0 for e, e0 in zip(by_e0, (0.05, 0.2, 0.5, 1.0, 2.0, 4.0), strict=True))
    by_d = [sh.shuffle_delta(5_000, 1.0, eps) for eps in (0.02, 0.05, 0.1, 0.2, 0.5)]
    assert all(a > b for a, b in zip(by_d, by_d[1:], strict=False))
    assert sh.shuffle_delta(5_000, 1.0, 1.0) == 0.0  # eps >= eps0


def test_huge_eps0_is_eps0() -> None:
    assert sh.shuffle_epsilon(1_000, 800.0, 1e-6) == 800.0
    assert sh.shuffle_epsilon(10_000, 20.0, 1e-6) == pytest.approx(20.0, rel=1e-6)


# --------------------------------------------------------------------------- checkin wiring
def test_cli_reports_the_smaller_bound_and_both_values() -> None:
    rc, out, err = _cli(
        "variant=shuffle", "local_epsilon=1", "num_clients=10000", "target_delta=1e-6", "--json"
    )
    assert rc == 0 and err == ""
    res = json.loads(out)
    both = res["epsilon_by_bound"]
    thm = pure_epsilon("shuffle", 1.0, 10_000, 10_000, 1e-6)
    assert both["Theorem 5.1"] == pytest.approx(thm, rel=1e-12)  # 0.4078 (docs)
    assert both[sh.FMT_NUMERICAL] == pytest.approx(sh.shuffle_epsilon(10_000, 1.0, 1e-6))
    assert both[sh.FMT_NUMERICAL] == pytest.approx(0.0530054, rel=1e-5)  # measured
    assert res["epsilon"] == pytest.approx(min(both.values()), rel=1e-12)
    assert res["bound"] == sh.FMT_NUMERICAL and res["composition"] == "single pass"


def test_several_passes_compose_the_fmt_bound() -> None:
    ev = CheckinEvent("shuffle", 1.0, 10_000)
    b = ev.bound(1e-6, 10)
    by = dict(b.by_bound)
    assert b.epsilon == min(by.values()) and b.bound == sh.FMT_NUMERICAL
    # every composition is at most basic composition of the per-pass bound at 1e-7 ...
    assert b.epsilon <= 10 * sh.shuffle_epsilon(10_000, 1.0, 1e-7) * (1 + 1e-12)
    # ... and at least one pass's epsilon
    assert b.epsilon > sh.shuffle_epsilon(10_000, 1.0, 1e-6)
    assert by["Theorem 5.1"] == compose_repetitions(ev.pass_epsilon, 10, 1e-6)[0]
    assert ev.epsilon(1e-6, 10) == b.epsilon  # what the ledger reports
    # delta at a target epsilon: never above the FMT delta (basic composition for 2 passes)
    assert ev.delta(0.1) <= sh.shuffle_delta(10_000, 1.0, 0.1)
    assert ev.delta(0.2, 2) <= 2 * sh.shuffle_delta(10_000, 1.0, 0.1) * (1 + 1e-12)
    assert ev.epsilon(ev.delta(0.1)) <= 0.1 * (1 + 1e-6)


def test_approximate_randomizers_keep_theorem_5_1_only() -> None:
    ev = CheckinEvent("shuffle", 0.02, 100_000, local_delta=1e-12)
    assert not ev.uses_fmt
    b = ev.bound(1e-6)
    assert b.by_bound == () and b.bound in ("Theorem 5.1", LOCAL_CAP)
    with pytest.raises(ConfigError, match=r"^variant=.* must be shuffle with local_delta=0"):
        ev.fmt_pass_epsilon(1e-6)
    assert not CheckinEvent("fixed", 1.0, 1000, 100).uses_fmt


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((0, 1.0, 1e-6), "num_clients"),
        ((-3, 1.0, 1e-6), "num_clients"),
        ((2.5, 1.0, 1e-6), "num_clients"),
        ((100, 0.0, 1e-6), "local_epsilon"),
        ((100, -1.0, 1e-6), "local_epsilon"),
        ((100, math.nan, 1e-6), "local_epsilon"),
        ((100, math.inf, 1e-6), "local_epsilon"),
        ((100, 1.0, 0.0), "delta"),
        ((100, 1.0, 1.0), "delta"),
        ((100, 1.0, -1e-6), "delta"),
        ((100, 1.0, math.nan), "delta"),
    ],
)
def test_bad_input_is_one_line(args: tuple[float, float, float], field: str) -> None:
    for fn in (sh.shuffle_epsilon, sh.closed_form_epsilon):
        with pytest.raises(ConfigError) as exc:
            fn(*args)  # type: ignore[operator]
        assert exc.value.field == field and "\n" not in str(exc.value)
        assert str(exc.value).startswith(f"{field}=")
    if field != "delta":
        with pytest.raises(ConfigError, match=f"^{field}="):
            sh.shuffle_delta(args[0], args[1], 0.1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="^epsilon="):
        sh.shuffle_delta(100, 1.0, -0.1)


@pytest.mark.parametrize(
    ("arg", "key"),
    [
        ("num_clients=0", "num_clients"),
        ("local_epsilon=0", "local_epsilon"),
        ("local_epsilon=-1", "local_epsilon"),
        ("target_delta=1", "target_delta"),
        ("target_delta=0", "target_delta"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(arg: str, key: str) -> None:
    base = {"num_clients": "1000", "local_epsilon": "1", "target_delta": "1e-6"}
    base[arg.split("=")[0]] = arg.split("=")[1]
    rc, out, err = _cli("variant=shuffle", *(f"{k}={v}" for k, v in base.items()))
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"fedpriv-account: error: {key}=")
