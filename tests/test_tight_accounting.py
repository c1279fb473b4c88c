"""Tight accounting (issue 25): each answer against an independent value or a lower bound.

Upper bounds must never fall below a computed lower bound (that would be an under-report) and
should sit close to it; every reference here is computed independently of the code under test
(dp-accounting called directly, scipy integration, closed forms).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import integrate, optimize, special, stats

from fedpriv.accounting.client_level.spec import ClientLevelSpec
from fedpriv.accounting.core.ledger import IncompatibleEventsError, PrivacyLedger
from fedpriv.accounting.core.lower_bound import epsilon_lower_bound
from fedpriv.accounting.core.vocabulary import Accountant
from fedpriv.accounting.samplers.fixed_size import WithoutReplacementGaussianEvent
from fedpriv.accounting.samplers.random_allocation import RandomAllocationEvent
from fedpriv.common.errors import ConfigError
from fedpriv.mechanisms.client_sampling import ClientSampling, CohortSampler

DELTA = 1e-5


def client_level(
    kind: str, z: float, acc: str = "pld", delta: float = DELTA, **cohort: float
) -> ClientLevelSpec:
    sampler = CohortSampler(num_clients=6000, client_sampling=ClientSampling(kind), **cohort)  # type: ignore[arg-type]
    return ClientLevelSpec(
        noise_multiplier=z, cohort=sampler, accountant=Accountant(acc), target_delta=delta
    )


def dense_rdp_epsilon(event: dp_event.DpEvent, count: int, orders: np.ndarray) -> float:
    """dp-accounting's own RDP accountant on a dense grid of orders (its best over them)."""
    acc = rdp_privacy_accountant.RdpAccountant(list(orders))
    acc.compose(event, count)
    return float(acc.get_epsilon(DELTA))


# ---------------------------------------------------------------- 1. RDP at the best order
def test_rdp_finds_the_best_order_where_the_default_grid_loses_half() -> None:
    """Poisson q = 0.001, z = 3, one round: dp-accounting's default grid answers 0.1029; the
    best order over 400 orders from 1.001 to 10^4 (dp-accounting itself) is ~0.046. fedpriv
    is within 1 % of that best and never above the default grid."""
    event = dp_event.PoissonSampledDpEvent(0.001, dp_event.GaussianDpEvent(3.0))
    ours = client_level("poisson", 3.0, "rdp", client_sample_rate=0.001).epsilon(1)
    default = dense_rdp_epsilon(event, 1, np.array(rdp_privacy_accountant.DEFAULT_RDP_ORDERS))
    best = dense_rdp_epsilon(event, 1, 1 + np.geomspace(1e-3, 1e4, 2000))
    spec = client_level("poisson", 3.0, client_sample_rate=0.001)
    lower = epsilon_lower_bound(spec.events_after(1), DELTA)
    assert default > 2 * best  # the grid this replaces lost more than half
    assert ours <= default
    assert ours == pytest.approx(best, rel=0.01)
    assert lower is not None and lower <= ours


@pytest.mark.slow
def test_rdp_best_order_at_the_edge_of_the_fractional_series() -> None:
    """q = 0.1, z = 0.5, 1000 rounds: the best order (~1.65) is where dp-accounting's series
    for fractional orders stop converging; default grid 236.45, best over 2,000 orders
    ~208.9. fedpriv within 1 % of it (and below the default grid)."""
    event = dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(0.5))
    ours = client_level("poisson", 0.5, "rdp", client_sample_rate=0.1).epsilon(1000)
    best = dense_rdp_epsilon(event, 1000, 1 + np.geomspace(0.3, 2.0, 2000))
    assert ours == pytest.approx(best, rel=0.01)
    assert ours < 0.9 * dense_rdp_epsilon(
        event, 1000, np.array(rdp_privacy_accountant.DEFAULT_RDP_ORDERS)
    )


# ---------------------------------------------------------------- 2. exact Gaussian
def exact_delta(eps: float, mu: float) -> float:
    """Dong, Roth, Su 2019, Cor. 2.13, by scipy directly (e^ε Φ(b) in logs: ε reaches 2,000)."""
    a, b = -eps / mu + mu / 2, -eps / mu - mu / 2
    return float(math.exp(special.log_ndtr(a)) - math.exp(eps + special.log_ndtr(b)))


@pytest.mark.parametrize(
    ("kind", "z", "rounds", "mu", "cohort"),
    [
        ("all", 0.5, 1000, math.sqrt(1000) / 0.5, {}),  # add/remove: μ = √T / z
        ("all", 3.0, 10, math.sqrt(10) / 3.0, {}),
        ("fixed_size", 3.0, 1, 2 / 3.0, {"num_sampled_clients": 6000}),  # replace-one: 2√T / z
    ],
)
def test_no_sampling_is_the_exact_gaussian(kind, z, rounds, mu, cohort) -> None:
    eps = client_level(kind, z, **cohort).epsilon(rounds)
    assert exact_delta(eps, mu) == pytest.approx(DELTA, rel=1e-6)


def test_exact_gaussian_is_below_the_old_pld_answer() -> None:
    """z = 0.5, 1000 rounds, no sampling: 2268.77 exactly (the PLD/RDP minimum said 2311.78)."""
    ledger = PrivacyLedger("pld")
    ledger.record(dp_event.GaussianDpEvent(0.5), 1000)
    assert ledger.analysis() == "gaussian (exact)"
    assert exact_delta(ledger.get_epsilon(DELTA), math.sqrt(1000) / 0.5) == pytest.approx(
        DELTA, rel=1e-6
    )
    assert ledger.get_delta(ledger.get_epsilon(DELTA)) == pytest.approx(DELTA, rel=1e-6)


# ---------------------------------------------------------------- 3. fixed-size cohorts
def family_pair(u: float, v: float, w: float, gamma: float, z: float) -> tuple[np.ndarray, ...]:
    """Densities of (1-γ)N(u,z²)+γN(v,z²) and (1-γ)N(u,z²)+γN(w,z²) (the pairs one round of
    sampling without replacement is a mixture of) on 200,001 points over ±(12z + 2)."""
    y = np.linspace(-12 * z - 2, 12 * z + 2, 200_001)
    base = (1 - gamma) * stats.norm.pdf(y, u, z)
    return y, base + gamma * stats.norm.pdf(y, v, z), base + gamma * stats.norm.pdf(y, w, z)


def hockey_stick(pair: tuple[np.ndarray, ...], eps: float) -> float:
    """∫ (p − e^ε q)₊ by the trapezoid rule (error far below the 1e-6 tolerance used)."""
    y, p, q = pair
    return float(integrate.trapezoid(np.maximum(p - math.exp(eps) * q, 0.0), y))


@pytest.mark.parametrize(("gamma", "z"), [(0.3, 1.0), (0.05, 0.5)])
def test_no_member_of_the_coupled_family_exceeds_the_dominating_pair(gamma, z) -> None:
    """Every (u, v, w) in [-1, 1]³ (random, plus the symmetric u = 0 pair) has a hockey-stick
    curve below the PLD's at every ε tried, negative ε included (quadrature tolerance 1e-6)."""
    n = 1000
    pld = WithoutReplacementGaussianEvent(z, round(gamma * n), n).pld()
    rng = np.random.default_rng(0)
    members = [(0.0, 1.0, -1.0), (1.0, 1.0, -1.0), (-1.0, 1.0, -1.0)]
    members += [tuple(rng.uniform(-1, 1, 3)) for _ in range(12)]
    for u, v, w in members:
        pair = family_pair(u, v, w, gamma, z)
        for eps in (-1.0, -0.1, 0.0, 0.1, 0.5, 1.5, 3.0):
            bound = pld.get_delta_for_epsilon(eps)
            assert hockey_stick(pair, eps) <= bound + 1e-6, (u, v, w, eps)


def test_the_symmetric_pair_alone_would_under_report() -> None:
    """The pitfall (Lebeda et al. 2024): the pair u = 0 (±C around the others) is not the
    worst case: at γ = 0.3, z = 1 the member u = w has a larger δ at ε = 1."""
    worst, symmetric = family_pair(-1, 1, -1, 0.3, 1.0), family_pair(0, 1, -1, 0.3, 1.0)
    assert hockey_stick(worst, 1.0) > 1.5 * hockey_stick(symmetric, 1.0)


@pytest.mark.parametrize(
    ("m", "z", "rounds", "ratio"),
    [
        (120, 1.0, 500, 1.15),
        pytest.param(120, 7.558, 1, 1.01, marks=pytest.mark.slow),  # RDP at large orders: 5 s
        (12, 1.0, 1, 1.01),
        (600, 2.0, 50, 1.15),
    ],
)
def test_fixed_size_between_its_lower_bound_and_the_rdp_fallback(m, z, rounds, ratio) -> None:
    """PLD of the dominating pair: at least the lower bound of two realised pairs, at most
    ``ratio`` times it (one round: the pair's profile is attained, so equal to the grids),
    and below dp-accounting's RDP bound (Wang et al.) that was the only analysis before. At
    N = 6,000, m = 120, z = 1, 500 rounds: [17.55, 19.48] against 31.50."""
    spec = client_level("fixed_size", z, num_sampled_clients=m)
    upper = spec.epsilon(rounds)
    lower = epsilon_lower_bound(spec.events_after(rounds), DELTA)
    rdp = client_level("fixed_size", z, "rdp", num_sampled_clients=m).epsilon(rounds)
    assert lower is not None
    assert lower <= upper <= ratio * lower
    assert upper < rdp


def test_fixed_size_rounds_at_several_noise_levels_compose() -> None:
    """Client shares with dropouts give rounds at a lower multiplier: they compose by PLD, and
    the result lies between the two pure ledgers; another kind of event is refused."""
    a, b = (
        WithoutReplacementGaussianEvent(2.0, 20, 1000),
        WithoutReplacementGaussianEvent(1.5, 20, 1000),
    )
    mixed = PrivacyLedger("pld", neighboring_relation="replace_one")
    mixed.record(a, 5)
    mixed.record(b, 5)
    pure = []
    for e in (a, b):
        ledger = PrivacyLedger("pld", neighboring_relation="replace_one")
        ledger.record(e, 10)
        pure.append(ledger.get_epsilon(DELTA))
    assert pure[0] < mixed.get_epsilon(DELTA) < pure[1]
    with pytest.raises(IncompatibleEventsError):
        mixed.record(dp_event.GaussianDpEvent(1.0), 1)


# ---------------------------------------------------------------- 4. random allocation
def truncated_exact_delta(sigma: float, eps: float) -> float:
    """The first r = 2 of t = 3 rounds released, k = 1, scalar contribution 1: the released
    pair is P = (1/3) N((1,0), σ²I) + (1/3) N((0,1), σ²I) + (1/3) N(0, σ²I) against
    Q = N(0, σ²I); the max over both directions of the hockey stick, by 2-d integration
    (grid error < 1e-6 in δ)."""
    g = np.linspace(-10 * sigma - 1, 10 * sigma + 2, 1601)
    y1, y2 = np.meshgrid(g, g, indexing="ij")
    qd = stats.norm.pdf(y1, 0, sigma) * stats.norm.pdf(y2, 0, sigma)
    ratio = (np.exp((2 * y1 - 1) / (2 * sigma**2)) + np.exp((2 * y2 - 1) / (2 * sigma**2)) + 1) / 3
    pd, cell = qd * ratio, (g[1] - g[0]) ** 2
    remove = float(np.sum(np.maximum(pd - math.exp(eps) * qd, 0)) * cell)
    add = float(np.sum(np.maximum(qd - math.exp(eps) * pd, 0)) * cell)
    return max(remove, add)


def test_two_of_three_allocation_rounds_are_charged_as_released() -> None:
    """t = 3, k = 1, σ = 1, δ = 1e-3, two rounds released: ε lies between the exact ε of the
    released pair (2-d integration) and 1.05 times it, and below the whole epoch's ε."""
    delta = 1e-3
    spec = client_level(
        "random_allocation", 1.0, delta=delta, allocation_window=3, rounds_per_client=1
    )
    exact = optimize.brentq(lambda e: truncated_exact_delta(1.0, e) - delta, 0.0, 20.0, xtol=1e-6)
    assert exact <= spec.epsilon(2) <= 1.05 * exact
    assert spec.epsilon(2) < spec.epsilon(3)


def test_one_released_round_is_poisson_sampling_at_one_over_t() -> None:
    """k = 1, t = 50, σ = 1: the first round alone is the Gaussian sampled at rate 1/50, as
    dp-accounting's PLD accountant answers (rel. 1e-3); ε grows with the rounds released, up
    to the whole epoch's at r = t (the same PLD), and 10 rounds are charged as 12."""
    spec = client_level("random_allocation", 1.0, allocation_window=50, rounds_per_client=1)
    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(dp_event.PoissonSampledDpEvent(1 / 50, dp_event.GaussianDpEvent(1.0)))
    assert spec.epsilon(1) == pytest.approx(acc.get_epsilon(DELTA), rel=1e-3)
    ((event, count),) = spec.events_after(10)
    assert (event.released_rounds, count) == (12, 1)
    eps = [spec.epsilon(r) for r in (1, 2, 4, 50)]
    assert eps == sorted(eps) and len(set(eps)) == 4
    assert spec.epsilon(50) == RandomAllocationEvent(1.0, 50).epsilon(DELTA)


def test_whole_epochs_and_a_partial_one_compose_between_their_neighbours() -> None:
    """t = 4, k = 1, σ = 1: 2 epochs and 2 rounds cost more than 2 epochs, less than 3, and no
    less than the lower bound; k = 2 charges the whole epoch at once (no analysis of a
    partial one), and a partial k = 2 epoch is refused in one line."""
    spec = client_level("random_allocation", 1.0, allocation_window=4, rounds_per_client=1)
    eps = [spec.epsilon(r) for r in (8, 10, 12)]
    assert eps[0] < eps[1] < eps[2]
    lower = epsilon_lower_bound(spec.events_after(10), DELTA)
    assert lower is not None and lower <= eps[1]
    two = client_level("random_allocation", 1.0, allocation_window=4, rounds_per_client=2)
    assert two.epsilon(1) == two.epsilon(4)
    with pytest.raises(ConfigError, match="released_rounds"):
        RandomAllocationEvent(1.0, 4, 2, released_rounds=2)


def monte_carlo_allocation_epsilon(sigma: float, t: int, k: int, delta: float) -> float:
    """ε at ``delta`` of one k-of-t allocation epoch, scalar contribution 1: P = the mean over
    k-subsets S of N(1_S, σ²I) against Q = N(0, σ²I), both directions, from 10^6 draws of
    each (seed 0; the estimate moves by ~0.3 % across seeds at 2 of 4, σ = 1, δ = 1e-3)."""
    rng = np.random.default_rng(0)
    subsets = np.array([np.isin(np.arange(t), s) for s in itertools.combinations(range(t), k)])

    def loss(y: np.ndarray) -> np.ndarray:  # log p/q
        a = (y @ subsets.T - k / 2) / sigma**2
        return np.logaddexp.reduce(a, axis=1) - math.log(len(subsets))

    yq = rng.normal(0, sigma, (1_000_000, t))
    lp, lq = loss(yq + subsets[rng.integers(len(subsets), size=len(yq))]), loss(yq)

    def excess(e: float) -> float:
        remove = np.mean(np.maximum(0, 1 - np.exp(e - lp)))
        add = np.mean(np.maximum(0, 1 - np.exp(e + lq)))
        return float(max(remove, add)) - delta

    return float(optimize.brentq(excess, 0.0, 20.0, xtol=1e-4))


@pytest.mark.slow  # two Monte Carlo samplers of 10^6 draws: ~8 s on 2 shared cores
def test_two_of_four_allocation_bounds_bracket_a_monte_carlo_estimate() -> None:
    """k = 2 of t = 4, σ = 1, δ = 1e-3: the reported ε (pld-accounting's decomposition, 3.725)
    is above this test's own Monte Carlo estimate of the true ε (~3.545) by more than the
    estimate's error, and the lower bound (the 2-of-4 pair's 99 % Monte Carlo bound, 3.488;
    round 1 alone gave 2.272) below it, within 5 % (pld-accounting's own lower PLD, 3.721,
    bounds the decomposition, not the scheme, so it is not used)."""
    spec = client_level(
        "random_allocation", 1.0, delta=1e-3, allocation_window=4, rounds_per_client=2
    )
    truth = monte_carlo_allocation_epsilon(1.0, 4, 2, 1e-3)
    lower = epsilon_lower_bound(spec.events_after(4), 1e-3)
    assert lower is not None and 0.95 * truth < lower < truth < truth * 1.02 < spec.epsilon(4)


def test_a_run_charges_the_rounds_released_and_resumes_mid_epoch() -> None:
    """The run's ledger (RunPrivacy) after each of 6 rounds of t = 4, k = 1 answers the spec's
    ε of that many rounds (rel. 1e-9); a checkpoint taken mid-epoch restores the same ε; with
    client noise shares, a round with dropouts charges its epoch whole at the weaker noise."""
    from fedpriv.run.run_privacy import RunPrivacy

    spec = client_level("random_allocation", 1.0, allocation_window=4, rounds_per_client=1)
    run = RunPrivacy(spec, nominal_cohort=1500)
    for r in range(1, 7):
        run.record_round(server_round=r)
        assert run.epsilon() == pytest.approx(spec.epsilon(r), rel=1e-9)
    resumed = RunPrivacy(spec, nominal_cohort=1500)
    resumed.load_state_dict(run.state_dict())
    assert resumed.epsilon() == run.epsilon()
    shares = dataclasses.replace(spec, noise_shares=1500)  # each client adds a share
    dropped = RunPrivacy(shares, nominal_cohort=1500)
    dropped.record_round(server_round=1)
    dropped.record_round(contributors=1000, server_round=2)
    weaker = shares.with_noise(math.sqrt(1000 / 1500)).epsilon(4)
    assert dropped.epsilon() == pytest.approx(weaker, rel=1e-9) and weaker > spec.epsilon(4)


# ---------------------------------------------------------------- 6. lower bounds
@pytest.mark.parametrize(("q", "z", "rounds"), [(0.02, 1.0, 500), (0.1, 0.8, 50), (0.5, 2.0, 10)])
def test_poisson_pld_is_within_two_percent_of_its_lower_bound(q, z, rounds) -> None:
    spec = client_level("poisson", z, client_sample_rate=q)
    upper = spec.epsilon(rounds)
    lower = epsilon_lower_bound(spec.events_after(rounds), DELTA)
    assert lower is not None
    assert lower <= upper <= 1.02 * lower


@pytest.mark.slow
def test_random_allocation_between_its_lower_and_upper_pld() -> None:
    spec = client_level("random_allocation", 1.0, allocation_window=10, rounds_per_client=1)
    upper = spec.epsilon(50)
    lower = epsilon_lower_bound(spec.events_after(50), DELTA)
    assert lower is not None
    assert lower <= upper <= 1.05 * lower


def test_checkin_passes_lie_above_their_lower_bounds() -> None:
    """Central-Gaussian check-ins, m = 10 slots, σ = 1, 10 passes: with p0 = 1 (random
    allocation) the PLD is within 5 % of the allocation's lower PLD; with p0 = 0.5 the upper
    bound still sits above the first-slot lower bound (a loose one)."""
    from fedpriv.accounting.checkin.gaussian import CheckinGaussianEvent

    full = CheckinGaussianEvent(1.0, 10, 1.0)
    lower = epsilon_lower_bound([(full, 10)], DELTA)
    assert lower is not None and lower <= full.epsilon(DELTA, 10) <= 1.05 * lower
    half = CheckinGaussianEvent(1.0, 10, 0.5)
    lower = epsilon_lower_bound([(half, 10)], DELTA)
    assert lower is not None and lower <= half.epsilon(DELTA, 10)


# ---------------------------------------------------------------- the command line
def test_cli_prints_the_lower_bound_and_the_rdp_fallback() -> None:
    from fedpriv.cli.account import run

    keys = {"num_clients": "6000", "num_rounds": "1", "target_delta": "1e-5"}
    fixed = {"client_sampling": "fixed_size", "num_sampled_clients": "12", "noise_multiplier": "1"}
    out = run("client-level", {**keys, **fixed, "lower_bound": "true"})
    assert out["epsilon_lower_bound"] <= out["epsilon"] < out["epsilon_rdp"]
    assert out["neighboring_relation"] == "replace_one"
    skellam = {"noise_multiplier": "1", "secure_mode": "true", "accountant": "rdp"}
    other = run("client-level", {**keys, **skellam, "lower_bound": "true"})
    assert other["epsilon_lower_bound"].startswith("not available for this analysis: ")


def test_cli_refuses_a_lower_bound_flag_that_is_not_a_bool() -> None:
    from fedpriv.cli.account import main

    argv = ["client-level", "num_clients=10", "noise_multiplier=1", "target_delta=1e-5"]
    assert main([*argv, "lower_bound=maybe"]) == 2


# ------------------------------------------------------------ 6. DP-FTRL's lower bound
FTRL_PATTERN = {"participation": "min_separation", "max_participations": "10"}


def ftrl(factorization: str, z: float, **extra: str) -> dict:
    from fedpriv.cli.account import run as account

    params = {"factorization": factorization, "noise_multiplier": str(z), "num_rounds": "500"}
    return account("ftrl", {**params, "lower_bound": "true", "target_delta": "1e-5", **extra})


@pytest.mark.parametrize(
    ("factorization", "z", "ratio"),
    [
        ("identity", 0.964, 1.0),
        ("banded", 4.3976, 1.0),
        ("blt", 4.897, 1.0),
        ("tree_honaker", 6.045, 1.3),
    ],
)
def test_ftrl_lies_between_the_noise_it_generates_and_a_stated_factor(factorization, z, ratio):
    """The README table's setting (500 rounds, 10 participations 50 apart): the lower bound
    comes from the materialised stream (one client in rounds o, o + 50, ...): equal to the
    reported ε (rel 1e-6) where the sensitivity bound is attained (identity, BandMF with 50
    bands, BLT), within 1.3x for Honaker's tree (its per-level bound is loose: 2.44 vs 3.00)."""
    out = ftrl(factorization, z, min_separation="50", **FTRL_PATTERN)
    lower, eps = out["epsilon_lower_bound"], out["epsilon"]
    assert lower <= eps * (1 + 1e-9)
    assert eps <= ratio * lower * (1 + 1e-6)


def test_amplified_bandmf_lies_within_one_percent_of_its_lower_bound() -> None:
    """Cyclic Poisson, 25 groups at q = 0.5, 25 bands (the table's amplified row at ε ≈ 3):
    the optimistic composition of one group's independent rounds is within 1 % below."""
    out = ftrl(
        "banded",
        3.325,
        bands="25",
        participation="cyclic_poisson",
        min_separation="25",
        client_sample_rate="0.5",
        num_clients="6000",
    )
    assert out["epsilon_lower_bound"] <= out["epsilon"] <= 1.01 * out["epsilon_lower_bound"]


def test_ftrl_lower_bound_catches_an_understated_sensitivity(monkeypatch) -> None:
    """An accountant told 0.8x the sensitivity (as an implementation that reads the wrong
    Cholesky factor) reports an ε below the bound of the noise the stream really generates."""
    from fedpriv.accounting.ftrl.lower import lower_bound_events
    from fedpriv.accounting.ftrl.spec import FTRLSpec

    spec = FTRLSpec(
        noise_multiplier=4.3976,
        factorization="banded",
        participation="min_separation",
        max_participations=10,
        min_separation=50,
        num_rounds=500,
        target_delta=DELTA,
    )
    scale = spec.sigma * spec.participation_sensitivity
    events = lower_bound_events(spec.strategy.noise_matrix(500), scale, spec.pattern, False)
    lower = epsilon_lower_bound(events, DELTA)
    wrong = tuple((t, 0.8 * s) for t, s in spec.prefix_sensitivities)
    monkeypatch.setitem(spec.__dict__, "prefix_sensitivities", wrong)
    assert spec.epsilon(500) < 0.9 * lower


def test_attained_sensitivity_is_a_realised_set_below_the_relaxation() -> None:
    """On random Gram matrices (n = 10, entries of both signs) the attained value is the
    signed sum of a valid set and at most the |X| relaxation; on a nonnegative banded X it
    equals brute force over every valid set."""
    from fedpriv.mechanisms.mf_sensitivity import (
        attained_sensitivity_squared,
        brute_force_sensitivity_squared,
        sensitivity_squared,
    )
    from fedpriv.mechanisms.participation import Participation

    pattern = Participation(kind="min_separation", max_participations=3, min_separation=3)
    rng = np.random.default_rng(0)
    for _ in range(20):
        a = rng.normal(size=(10, 10))
        x = a @ a.T
        value, rounds = attained_sensitivity_squared(x, pattern)
        assert value == pytest.approx(x[np.ix_(rounds, rounds)].sum(), rel=1e-12)
        assert len(rounds) <= 3 and all(j - i >= 3 for i, j in itertools.pairwise(rounds))
        assert value <= sensitivity_squared(x, pattern) * (1 + 1e-12)
    band = np.eye(10) + 0.4 * (np.eye(10, k=1) + np.eye(10, k=-1))
    assert attained_sensitivity_squared(band, pattern)[0] == pytest.approx(
        brute_force_sensitivity_squared(band, pattern), rel=1e-12
    )


# ------------------------------------------- 6. generalized DP-SGD's lower bound (one record)
def batch_clipping(sampling: str, n: int, m: int, s: int, epochs: int, sigma: float) -> dict:
    from fedpriv.cli.account import run as account

    params = {"sampling": sampling, "num_samples": n, "num_groups": m, "group_size": s}
    params |= {"epochs": epochs, "noise_multiplier": sigma, "target_delta": DELTA}
    return account(
        "batch-clipping", {k: str(v) for k, v in {**params, "lower_bound": True}.items()}
    )


@pytest.mark.parametrize("sampling", ["shuffle", "subsample"])
def test_full_batch_rounds_are_the_exact_gaussian_from_both_sides(sampling) -> None:
    """m·s = N: one round per epoch holds every record, so the release is the Gaussian with
    μ = √E/σ and the realised pair attains it: lower within 1e-4 (relative) of the ε."""
    out = batch_clipping(sampling, 600, 1, 600, 5, 2.0)
    assert out["epsilon"] == pytest.approx(out["epsilon_lower_bound"], rel=1e-4)
    assert out["epsilon_lower_bound"] <= out["epsilon"]


@pytest.mark.parametrize(
    ("sampling", "m", "s", "epochs", "sigma", "ratio"),
    [
        ("shuffle", 1, 60, 1, 2.0, 3.8),
        ("shuffle", 10, 6, 3, 1.0, 4.1),
        ("subsample", 1, 60, 1, 2.0, 1.03),
        ("subsample", 10, 6, 3, 1.0, 1.06),
    ],
)
def test_generalized_dpsgd_between_its_lower_bound_and_a_stated_factor(
    sampling, m, s, epochs, sigma, ratio
) -> None:
    """N = 600, 10 rounds per epoch. Shuffling: the paper's analysis reveals which rounds hold
    the record (the mixture over c), so it sits about 4x above the realised pairs (the full
    ±C shift's Monte Carlo bound since issue 40; factors measured, +1 %). Subsampling: the
    fixed-size sampled Gaussian (issue 40) is within 2.4 % and 5.6 % of its realised pair
    (before: 4.3x and 3.1x with the mixture). Never below."""
    out = batch_clipping(sampling, 600, m, s, epochs, sigma)
    lower = out["epsilon_lower_bound"]
    assert lower <= out["epsilon"] <= ratio * lower


@pytest.mark.slow
def test_subsampling_at_mnist_scale_leaves_fifty_times_room() -> None:
    """Full MNIST (N = 60,000, 64 records a round, 10 epochs, σ = 1): the paper's mixture
    (23.43) left fifty times room above the lower bound 0.468; the default since issue 40,
    the fixed-size sampled Gaussian, reports 0.634 (0.644 on the old absolute ε grid)."""
    out = batch_clipping("subsample", 60000, 64, 1, 10, 1.0)
    assert 0.4 <= out["epsilon_lower_bound"] <= 0.5
    assert out["paper_epsilon"] == pytest.approx(23.43, abs=0.01)
    assert out["epsilon"] == pytest.approx(0.634, abs=0.002)
