"""Golden and property tests of the Gaussian DP toolkit (fedpriv.accounting.accountants.gdp)."""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
from dp_accounting import dp_event, gaussian_mechanism
from dp_accounting.pld import pld_privacy_accountant, privacy_loss_distribution
from hypothesis import given, settings
from hypothesis import strategies as st

from fedpriv.accounting.accountants import gdp
from fedpriv.cli.account import run as account
from fedpriv.common.errors import ConfigError

mp.mp.dps = 60


def mp_delta(eps: float, mu: float) -> mp.mpf:
    """Dong-Roth-Su Corollary 2.13 evaluated at 60 digits."""
    eps, mu = mp.mpf(eps), mp.mpf(mu)
    return mp.ncdf(-eps / mu + mu / 2) - mp.e**eps * mp.ncdf(-eps / mu - mu / 2)


MUS = [0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0]
EPSS = [0.0, 0.1, 1.0, 5.0, 20.0, 60.0]


# --------------------------------------------------------------------------- golden: mpmath
@pytest.mark.parametrize("mu", MUS)
def test_delta_matches_mpmath(mu: float) -> None:
    # tolerance: 1e-9 relative wherever the true delta is a normal float (> 1e-290).
    for eps in EPSS:
        want = mp_delta(eps, mu)
        got = gdp.gdp_delta(eps, mu)
        if want > mp.mpf("1e-290"):
            assert got == pytest.approx(float(want), rel=1e-9), (eps, mu)
        else:
            assert got <= 1e-280


@pytest.mark.parametrize("mu", [0.1, 1.0, 3.0, 10.0])
@pytest.mark.parametrize("delta", [1e-2, 1e-5, 1e-10, 1e-18])
def test_epsilon_matches_mpmath_root(mu: float, delta: float) -> None:
    eps = gdp.gdp_epsilon(delta, mu)
    if mp_delta(0.0, mu) <= delta:
        assert eps == 0.0
        return
    lo, hi = mp.mpf(0), mp.mpf(200)
    for _ in range(120):  # bisection at 60 digits: bracket width 200 / 2^120
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mp_delta(mid, mu) > delta else (lo, mid)
    want = hi
    # tolerance: 1e-9 relative on epsilon (root found at 60 digits)
    assert eps == pytest.approx(float(want), rel=1e-9)
    # never under-reported: the profile at the returned epsilon meets the target
    assert mp_delta(eps, mu) <= delta * (1 + 1e-12)


def test_tradeoff_matches_mpmath() -> None:
    for mu in [0.5, 2.0]:
        for alpha in [1e-12, 1e-4, 0.1, 0.5, 0.9]:
            want = mp.ncdf(-mp.sqrt(2) * mp.erfinv(2 * mp.mpf(alpha) - 1) - mu)
            # tolerance: 1e-9 relative
            assert gdp.gdp_tradeoff(alpha, mu) == pytest.approx(float(want), rel=1e-9)
    assert gdp.gdp_tradeoff([0.0, 1.0], 1.0).tolist() == pytest.approx([1.0, 0.0])


def test_profile_is_conjugate_of_tradeoff() -> None:
    # delta(eps) = sup_alpha 1 - G_mu(alpha) - e^eps alpha  (Dong-Roth-Su Prop. 2.12).
    alpha = np.concatenate([np.logspace(-14, -1, 4000), np.linspace(0.1, 1.0, 4000)])
    for mu in [0.3, 1.0, 4.0]:
        for eps in [0.0, 0.5, 2.0, 6.0]:
            if gdp.gdp_delta(eps, mu) < 1e-8:
                continue  # the optimal alpha is below the grid
            sup = float(np.max(1.0 - gdp.gdp_tradeoff(alpha, mu) - math.exp(eps) * alpha))
            # grid sup is below the true sup (up to 1e-15 cancellation in 1 - G - e^eps a),
            # and close to it (1e-4 relative on this grid)
            assert sup <= gdp.gdp_delta(eps, mu) * (1 + 1e-9) + 1e-15
            assert sup == pytest.approx(gdp.gdp_delta(eps, mu), rel=1e-4, abs=1e-12)


# --------------------------------------------------------------------------- golden: dp-accounting
@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.0, 20.0])
def test_delta_matches_dp_accounting_gaussian_pld(sigma: float) -> None:
    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(dp_event.GaussianDpEvent(sigma))
    for eps in [0.0, 0.5, 2.0, 5.0]:
        pld = acc.get_delta(eps)
        ours = gdp.gdp_delta(eps, 1.0 / sigma)
        if pld > 1e-9:
            # tolerance: PLD (pessimistic, grid 1e-4) within 1e-5 relative of the exact value
            assert ours == pytest.approx(pld, rel=1e-5)
        assert ours <= pld * (1 + 1e-9) + 1e-15


@pytest.mark.parametrize("sigma", [0.3, 1.0, 5.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-12])
def test_epsilon_matches_dp_accounting_analytic(sigma: float, delta: float) -> None:
    # dp_accounting.gaussian_mechanism is Balle-Wang's exact Gaussian; tolerance 1e-9 rel.
    want = gaussian_mechanism.get_epsilon_gaussian(sigma, delta)
    assert gdp.gdp_epsilon(delta, 1.0 / sigma) == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_composition_matches_pld_of_two_gaussians() -> None:
    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(dp_event.GaussianDpEvent(1.0))
    acc.compose(dp_event.GaussianDpEvent(2.0), 3)
    mu = gdp.compose_mu([1.0, 0.5, 0.5, 0.5])
    assert mu == pytest.approx(math.sqrt(1 + 3 * 0.25))
    for eps in [0.5, 1.0, 3.0]:
        # tolerance: 1e-4 relative (PLD discretization over four compositions)
        assert gdp.gdp_delta(eps, mu) == pytest.approx(acc.get_delta(eps), rel=1e-4)


def test_group_privacy_is_gaussian_with_g_times_sensitivity() -> None:
    for g in [2, 4, 8]:
        pld = privacy_loss_distribution.from_gaussian_mechanism(
            standard_deviation=2.0, sensitivity=float(g), value_discretization_interval=1e-4
        )
        mu = gdp.group_mu(0.5, g)
        assert mu == 0.5 * g
        for eps in [1.0, 3.0]:
            want = pld.get_delta_for_epsilon(eps)
            # tolerance: 1e-4 relative (PLD grid)
            assert gdp.gdp_delta(eps, mu) == pytest.approx(want, rel=1e-4)
    with pytest.raises(ConfigError, match="group_privacy=0"):
        gdp.group_mu(1.0, 0)


def test_analytic_gaussian_matches_balle_wang() -> None:
    for eps0, delta0 in [(1.0, 1e-5), (0.1, 1e-6), (4.0, 1e-10)]:
        sigma = gdp.analytic_gaussian_sigma(eps0, delta0, sensitivity=2.0)
        want = 2.0 * gaussian_mechanism.get_sigma_gaussian(eps0, delta0)
        # tolerance: 1e-8 relative against dp-accounting's Balle-Wang calibration
        assert sigma == pytest.approx(want, rel=1e-8)
        assert gdp.gdp_delta(eps0, 2.0 / sigma) <= delta0
        # 1% less noise violates the target
        assert gdp.gdp_delta(eps0, 2.0 / (0.99 * sigma)) > delta0


# --------------------------------------------------------------------------- mixtures
def test_mixture_matches_weighted_mpmath_sum() -> None:
    mus, w = [0.5, 1.0, 3.0], [0.2, 0.5, 0.3]
    for eps in [0.0, 1.0, 4.0]:
        want = sum(wi * mp_delta(eps, mi) for wi, mi in zip(w, mus))
        # tolerance: 1e-9 relative
        assert gdp.mixture_delta(eps, mus, w) == pytest.approx(float(want), rel=1e-9)
    e = gdp.mixture_epsilon(1e-5, mus, w)
    assert gdp.mixture_delta(e, mus, w) <= 1e-5
    assert gdp.gdp_epsilon(1e-5, 1.0) < e < gdp.gdp_epsilon(1e-5, 3.0)
    # single component = G_mu
    assert gdp.mixture_epsilon(1e-5, [2.0], [1.0]) == pytest.approx(gdp.gdp_epsilon(1e-5, 2.0))


def test_mixture_with_non_private_component() -> None:
    assert gdp.mixture_epsilon(1e-3, [1.0, math.inf], [0.99, 0.01]) == math.inf
    e = gdp.mixture_epsilon(1e-2, [1.0, math.inf], [0.999, 0.001])
    assert math.isfinite(e)
    assert gdp.mixture_delta(e, [1.0, math.inf], [0.999, 0.001]) <= 1e-2
    with pytest.raises(ConfigError, match="weights"):
        gdp.mixture_delta(1.0, [1.0, 2.0], [0.5, 0.6])


# --------------------------------------------------------------------------- edge cases
def test_edges() -> None:
    assert gdp.gdp_epsilon(1e-5, 0.0) == 0.0
    assert gdp.gdp_epsilon(1e-5, math.inf) == math.inf
    assert gdp.gdp_delta(1.0, 0.0) == 0.0
    # a single step at a large delta may be exactly 0
    assert gdp.gdp_epsilon(0.5, 0.5) == 0.0
    # extreme delta stays finite and monotone
    e18, e15 = gdp.gdp_epsilon(1e-18, 1.0), gdp.gdp_epsilon(1e-15, 1.0)
    assert math.isfinite(e18) and e18 > e15
    # 10^6 steps
    out = account(
        "gaussian", {"noise_multiplier": "100", "steps": "1000000", "target_delta": "1e-5"}
    )
    assert math.isfinite(out["epsilon"]) and out["mu"] == pytest.approx(10.0)
    assert (
        account("gaussian", {"noise_multiplier": "0", "target_delta": "1e-5"})["epsilon"]
        == math.inf
    )


def test_cli_calibration_round_trip() -> None:
    out = account("gaussian", {"steps": "50", "target_epsilon": "2", "target_delta": "1e-6"})
    sigma = out["noise_multiplier"]
    assert out["calibrated"] == "noise_multiplier"
    assert gdp.gdp_epsilon(1e-6, math.sqrt(50) / sigma) <= 2.0
    assert gdp.gdp_epsilon(1e-6, math.sqrt(50) / (0.99 * sigma)) > 2.0
    out = account("gdp", {"target_epsilon": "1", "target_delta": "1e-5"})
    assert gdp.gdp_delta(1.0, out["mu"]) <= 1e-5
    assert account("gdp", {"mu": "1", "target_epsilon": "1"})["delta"] == pytest.approx(
        float(mp_delta(1.0, 1.0)), rel=1e-12
    )


@pytest.mark.parametrize(
    "params, key",
    [
        ({"mu": "1", "target_delta": "1.5"}, "target_delta"),
        ({"mu": "-1", "target_delta": "1e-5"}, "mu"),
        ({"mu": "1", "target_delta": "1e-5", "bogus": "2"}, "bogus"),
        ({"mu": "1"}, "target_delta"),
    ],
)
def test_cli_errors_name_the_key(params: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        account("gdp", params)
    assert str(err.value).startswith(key + "=")


# --------------------------------------------------------------------------- properties
@settings(max_examples=60, deadline=None)
@given(mu=st.floats(1e-3, 50.0), delta=st.floats(1e-15, 0.5), factor=st.floats(1.01, 3.0))
def test_epsilon_monotone_never_nan(mu: float, delta: float, factor: float) -> None:
    e = gdp.gdp_epsilon(delta, mu)
    assert not math.isnan(e) and e >= 0.0
    assert gdp.gdp_epsilon(delta, mu * factor) >= e - 1e-12
    assert gdp.gdp_epsilon(delta / factor, mu) >= e - 1e-12


@settings(max_examples=40, deadline=None)
@given(sigma=st.floats(0.2, 20.0), steps=st.integers(1, 10_000), factor=st.floats(1.01, 2.0))
def test_gaussian_grows_with_steps_falls_with_noise(
    sigma: float, steps: int, factor: float
) -> None:
    def eps(s: float, t: int) -> float:
        return account("gaussian", {"noise_multiplier": s, "steps": t, "target_delta": 1e-5})[
            "epsilon"
        ]

    base = eps(sigma, steps)
    assert eps(sigma, steps + 1) >= base - 1e-12
    assert eps(sigma * factor, steps) <= base + 1e-12
