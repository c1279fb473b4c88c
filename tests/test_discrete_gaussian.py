"""Issue 14, item 6: secure_mode's Gaussian noise is a lattice discrete Gaussian.

Canonne, Kamath, Steinke 2020 ("The Discrete Gaussian for Differential Privacy",
arXiv:2004.00010): the sampler's law, the outputs' support (neighbouring inputs share it), the
event's RDP (Thm 15: the continuous Gaussian's curve), and the run's wiring.
"""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant

from fedpriv.accounting.accountants.rdp import INTEGER_ORDERS
from fedpriv.accounting.core.ledger import PrivacyLedger
from fedpriv.accounting.loss_models.discrete_gaussian import DiscreteGaussianEvent
from fedpriv.common.errors import ConfigError
from fedpriv.mechanisms.lattice_gaussian import (
    LATTICE_BITS,
    add_lattice_gaussian,
    lattice_step,
    sample_discrete_gaussian,
)
from fedpriv.run.config import compose_config as _cfg
from fedpriv.run.header import secure_mode_warning
from fedpriv.run.prepare import prepare

SECURE = [
    "client=client_level",
    "privacy=client_level",
    "model=logistic",
    "num_clients=20",
    "privacy.secure_mode=true",
    "privacy.accountant=rdp",
]


def _pmf(sigma: float, ks: np.ndarray) -> np.ndarray:
    """N_Z(0, σ²) at ``ks`` (normalized over |k| <= 40σ)."""
    support = np.arange(-int(40 * sigma), int(40 * sigma) + 1)
    z = np.exp(-(support**2) / (2 * sigma**2)).sum()
    return np.exp(-(ks**2) / (2 * sigma**2)) / z


@pytest.mark.parametrize("sigma", [0.7, 3.0, 25.0])
def test_sampler_has_the_discrete_gaussian_law(sigma: float) -> None:
    n = 400_000
    k = sample_discrete_gaussian(sigma, (n,), np.random.default_rng(1))
    assert k.dtype == np.int64
    lo, hi = int(-3 * sigma) - 1, int(3 * sigma) + 1
    ks = np.arange(lo, hi + 1)
    counts = np.array([(k == v).sum() for v in ks])
    p = _pmf(sigma, ks)
    # each cell's count is binomial(n, p): 5 standard errors (+1 count)
    assert np.all(np.abs(counts - n * p) <= 5 * np.sqrt(n * p * (1 - p)) + 1), (counts, n * p)
    support = np.arange(-int(40 * sigma), int(40 * sigma) + 1)
    var = float((support**2 * _pmf(sigma, support)).sum())
    assert k.var() == pytest.approx(var, rel=5 * math.sqrt(2 / n) * 3)


def test_neighbouring_inputs_share_the_support() -> None:
    """x and x' = x + C e_1: both outputs lie on the lattice γZ^d, exactly (out/γ is an
    integer), and every lattice point near either centre is drawn for both."""
    c, d = 1.0, 4
    step = lattice_step(c, d)
    assert step == 2.0 ** math.floor(math.log2(2.0**-LATTICE_BITS / 2))
    x = {"w": np.array([0.123456789, -0.5, 0.25, 1e-9])}
    xp = {"w": x["w"] + np.array([c, 0, 0, 0])}
    sd = 3 * step  # a few lattice steps, so that supports can be compared by sampling
    rng = np.random.default_rng(7)
    outs = [
        np.stack([add_lattice_gaussian(v, sd, step, rng)["w"] for _ in range(20_000)])
        for v in (x, xp)
    ]
    for out in outs:
        units = out / step
        np.testing.assert_array_equal(units, np.rint(units))  # exact lattice points
    # coordinate 2 is equal in x and x': the same integers are drawn for both
    a, b = (set(np.rint(o[:, 1] / step).astype(int)) for o in outs)
    centre = round(-0.5 / step)
    assert set(range(centre - 6, centre + 7)) <= a & b
    # whereas float Gaussian noise keeps the input's low-order bits: x + N(0, sd²) rounded
    # to the lattice differs from the unrounded float (the attack surface removed here)
    plain = x["w"][0] + rng.normal(0, sd, 1000)
    assert not np.all(plain / step == np.rint(plain / step))


def test_event_rdp_is_the_gaussian_curve() -> None:
    z, q, steps = 1.3, 0.02, 300
    orders = INTEGER_ORDERS
    np.testing.assert_allclose(
        DiscreteGaussianEvent(z).rdp(orders), orders / (2 * z * z), rtol=1e-12
    )
    ledger = PrivacyLedger(accountant="rdp")
    ledger.record(DiscreteGaussianEvent(z, q), steps)
    ref = RdpAccountant(list(orders))
    ref.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps)
    assert ledger.get_epsilon(1e-5) == pytest.approx(ref.get_epsilon(1e-5), rel=1e-9)
    with pytest.raises(NotImplementedError, match="accounted by RDP only"):
        pld = PrivacyLedger(accountant="pld")
        pld.record(DiscreteGaussianEvent(z, q), steps)
        pld.get_epsilon(1e-5)


def test_secure_client_level_run_accounts_lattice_noise() -> None:
    plan, algorithm = prepare(_cfg([*SECURE, "client_sampling=poisson", "client_sample_rate=0.25"]))
    assert algorithm.hardened_noise is True
    ((event, count),) = plan.privacy.round_events()
    z = float(plan.privacy.summary()["noise_multiplier"])
    assert event == DiscreteGaussianEvent(z / (1 + 2.0**-LATTICE_BITS), 0.25) and count == 1


def test_secure_client_level_release_is_on_the_lattice() -> None:
    """The serialized release: lattice points, noise std σ_Δ C (4 standard errors)."""
    _, algorithm = prepare(_cfg(SECURE))
    d = 20_000
    total = {"w": np.full(d, 0.3), "b": np.zeros(3)}
    out, _, _ = algorithm.release(total, 1, algorithm.initial_round_config())
    step = lattice_step(1.0, d + 3)
    for v in out.values():
        np.testing.assert_array_equal(v / step, np.rint(v / step))
    sd = algorithm.privacy.update_noise_multiplier * 1.0
    noise = out["w"] - total["w"]
    assert noise.std() == pytest.approx(sd, rel=4 * math.sqrt(1 / (2 * d)))
    assert abs(noise.mean()) <= 4 * sd / math.sqrt(d)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["privacy.accountant=pld"], "privacy.accountant='pld' cannot account privacy.secure"),
        (["client_sampling=fixed_size", "num_sampled_clients=5"], "must be all or poisson"),
        (["client.noise_placement=clients"], "client=client_level_skellam"),
    ],
)
def test_secure_client_level_refuses_what_no_analysis_covers(
    extra: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        prepare(_cfg([*SECURE, *extra]))


def test_secure_mode_warns_for_float_noise_clients() -> None:
    _, algorithm = prepare(_cfg(["model=logistic", "privacy.secure_mode=true", "client=checkin"]))
    line = secure_mode_warning(algorithm)
    assert line.startswith("fedpriv: warning: privacy.secure_mode=true: CheckinClient draws float")
    _, algorithm = prepare(_cfg(SECURE))
    assert secure_mode_warning(algorithm) == ""
    # σ = 0 draws no noise: nothing to harden
    _, algorithm = prepare(
        _cfg(["model=logistic", "privacy.secure_mode=true", "privacy.noise_multiplier=0"])
    )
    assert secure_mode_warning(algorithm) == ""
