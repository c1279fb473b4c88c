"""Exact q_E(c) of the batch-clipping paper against brute force, Table 1, and properties."""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from fedpriv.accounting.accountants import gdp
from fedpriv.accounting.batch_clipping import spec as bc
from fedpriv.accounting.core.ledger import IncompatibleEventsError, PrivacyLedger
from fedpriv.accounting.loss_models import gaussian_mixture as mix
from fedpriv.accounting.samplers import batch_groups as bg
from fedpriv.cli.account import run as account
from fedpriv.common.errors import ConfigError


# --------------------------------------------------------------------------- brute force
def _sum_k2(perm: tuple[int, ...], g: int, m: int, s: int, rounds: int) -> int:
    """sum over rounds of k^2 for a permutation (perm[pos] = record; records < g differ)."""
    batch = m * s
    total = 0
    for r in range(rounds):
        groups = {(pos % batch) // s for pos in range(r * batch, (r + 1) * batch) if perm[pos] < g}
        total += len(groups) ** 2
    return total


def brute_shuffle(n: int, m: int, s: int, g: int, epochs: int) -> dict[int, Fraction]:
    """Exhaustive over all permutations of every epoch (each epoch all N // (m s) rounds)."""
    rounds = n // (m * s)
    per_epoch = Counter(_sum_k2(p, g, m, s, rounds) for p in itertools.permutations(range(n)))
    total = math.factorial(n)
    law = {0: Fraction(1)}
    for _ in range(epochs):  # exhaustive product of independent epochs
        new: dict[int, Fraction] = Counter()
        for t1, p1 in law.items():
            for t2, c2 in per_epoch.items():
                new[t1 + t2] += p1 * Fraction(c2, total)
        law = dict(new)
    return law


def brute_subsample(n: int, m: int, s: int, g: int, rounds: int) -> dict[int, Fraction]:
    """Exhaustive: a uniform permutation's first m s positions are a uniform S_b, split."""
    per_round = Counter(_sum_k2(p, g, m, s, 1) for p in itertools.permutations(range(n)))
    total = math.factorial(n)
    tuples = itertools.product(per_round.items(), repeat=rounds)
    law: dict[int, Fraction] = Counter()
    for combo in tuples:
        prob = Fraction(1)
        for _, c in combo:
            prob *= Fraction(c, total)
        law[sum(t for t, _ in combo)] += prob
    return dict(law)


def partition_shuffle_epoch(n: int, m: int, s: int, g: int) -> dict[int, Fraction]:
    """Second, independent exact method: multivariate hypergeometric split of the g records
    over the rounds (and the unused slots), times a brute-force occupancy law per round."""
    batch = m * s
    rounds, unused = n // batch, n - (n // batch) * batch
    occ: dict[int, Counter] = {}
    for j in range(g + 1):
        occ[j] = Counter(
            len({slot // s for slot in c}) ** 2 for c in itertools.combinations(range(batch), j)
        )
    law: dict[int, Fraction] = Counter()
    for split in itertools.product(range(g + 1), repeat=rounds + 1):
        if sum(split) != g or split[-1] > unused:
            continue
        weight = Fraction(math.comb(unused, split[-1]), math.comb(n, g))
        dist = {0: weight}
        for j in split[:-1]:
            new: dict[int, Fraction] = Counter()
            for t1, p1 in dist.items():
                for t2, c2 in occ[j].items():
                    new[t1 + t2] += p1 * c2
            dist = new
        for t, p in dist.items():
            law[t] += p
    return dict(law)


def assert_law(got: bg.SumSquaresLaw, want: dict[int, Fraction], rel: float = 1e-12) -> None:
    d = got.as_dict()
    assert set(d) == {t for t, p in want.items() if p > 0}
    for t, p in want.items():
        # tolerance: float vs exact rational, 1e-12 relative
        assert d[t] == pytest.approx(float(p), rel=rel, abs=1e-300), t


# --------------------------------------------------------------------------- q_E exact
@pytest.mark.parametrize(
    "m, s, g",
    [(1, 2, 1), (1, 2, 2), (2, 1, 2), (1, 3, 2), (3, 1, 3), (2, 2, 2), (2, 2, 3), (1, 1, 2)],
)
def test_shuffle_epoch_against_all_permutations(m: int, s: int, g: int) -> None:
    n = 7  # 5040 permutations; leaves unused records when m s does not divide 7
    want = brute_shuffle(n, m, s, g, 1)
    assert_law(bg.sum_squares_law("shuffle", n, m, s, n // (m * s), g, tail_tol=0.0), want)


@pytest.mark.parametrize("m, s, g, epochs", [(1, 2, 2, 3), (2, 1, 2, 2), (1, 1, 3, 2)])
def test_shuffle_epochs_against_brute_force(m: int, s: int, g: int, epochs: int) -> None:
    n = 5
    want = brute_shuffle(n, m, s, g, epochs)
    rounds = epochs * (n // (m * s))
    assert_law(bg.sum_squares_law("shuffle", n, m, s, rounds, g, tail_tol=0.0), want)


def test_partial_epoch() -> None:
    # 2 of the 3 rounds of an epoch: a brute-force epoch over 2 rounds.
    n, m, s, g = 6, 1, 2, 2
    perms = list(itertools.permutations(range(n)))
    want = Counter(_sum_k2(p, g, m, s, 2) for p in perms)
    law = bg.sum_squares_law("shuffle", n, m, s, 3 + 2, g, tail_tol=0.0)  # 1 epoch + 2 rounds
    full = brute_shuffle(n, m, s, g, 1)
    expect: dict[int, Fraction] = Counter()
    for t1, p1 in full.items():
        for t2, c2 in want.items():
            expect[t1 + t2] += p1 * Fraction(c2, len(perms))
    assert_law(law, dict(expect))


@pytest.mark.parametrize(
    "m, s, g", [(2, 4, 3), (1, 8, 4), (8, 1, 3), (3, 3, 4), (2, 3, 6), (6, 1, 5)]
)
def test_shuffle_epoch_against_partition_method(m: int, s: int, g: int) -> None:
    n = 43  # several rounds plus unused records
    want = partition_shuffle_epoch(n, m, s, g)
    assert_law(bg.shuffle_epoch_law(n, m, s, g), want)


@pytest.mark.parametrize(
    "m, s, g, rounds", [(1, 2, 2, 2), (2, 1, 2, 2), (2, 2, 3, 1), (1, 3, 3, 2), (2, 1, 1, 3)]
)
def test_subsample_against_brute_force(m: int, s: int, g: int, rounds: int) -> None:
    n = 6
    want = brute_subsample(n, m, s, g, rounds)
    assert_law(bg.sum_squares_law("subsample", n, m, s, rounds, g, tail_tol=0.0), want)


def test_subsample_g1_is_binomial() -> None:
    # g = 1: k is Bernoulli(m s / N) per round, so c^2 ~ Binomial(T, m s / N).
    n, m, s, rounds = 1000, 4, 8, 500
    law = bg.sum_squares_law("subsample", n, m, s, rounds, 1, tail_tol=0.0).as_dict()
    pmf = scipy.stats.binom.pmf(np.arange(rounds + 1), rounds, m * s / n)
    for t, p in enumerate(pmf):
        if p > 1e-250:
            # tolerance: 1e-9 relative (repeated squaring in floats)
            assert law[t] == pytest.approx(p, rel=1e-9)


def test_shuffle_against_monte_carlo() -> None:
    n, m, s, g, epochs, draws = 600, 4, 5, 3, 2, 40_000
    rng = np.random.default_rng(20240601)
    t = np.zeros(draws, dtype=int)
    for _ in range(epochs):
        pos = rng.random((draws, n)).argpartition(g, axis=1)[:, :g]  # uniform g-subsets
        rnd, grp = pos // (m * s), (pos % (m * s)) // s
        for r in np.unique(rnd):
            k = np.zeros(draws, dtype=int)
            seen = np.zeros((draws, m), dtype=bool)
            hit = rnd == r
            rows = np.nonzero(hit)[0]
            seen[rows, grp[hit]] = True
            k = seen.sum(axis=1)
            t += k * k
    law = bg.sum_squares_law("shuffle", n, m, s, epochs * (n // (m * s)), g).as_dict()
    obs = Counter(t.tolist())
    keys = [k for k in law if law[k] * draws >= 5]
    exp = np.array([law[k] * draws for k in keys])
    got = np.array([obs.get(k, 0) for k in keys])
    rest_exp, rest_got = draws - exp.sum(), draws - got.sum()
    chi2 = float(((got - exp) ** 2 / exp).sum() + ((rest_got - rest_exp) ** 2 / max(rest_exp, 1)))
    # fixed seed; a correct law passes at p > 1e-4
    assert scipy.stats.chi2.sf(chi2, len(keys)) > 1e-4


# --------------------------------------------------------------------------- Table 1
def test_table1_batch_clipping_shuffling_g1_is_exact() -> None:
    # m = 1, g = 1, m s | N: every epoch touches exactly one round, q = point mass at E.
    out = account(
        "batch-clipping",
        {
            "sampling": "shuffle",
            "num_samples": "1000",
            "num_groups": "1",
            "group_size": "10",
            "epochs": "7",
            "noise_multiplier": "1.5",
            "target_delta": "1e-5",
        },
    )
    assert out["q_E"] == {"7": pytest.approx(1.0)}
    want = gdp.gdp_epsilon(1e-5, math.sqrt(7) / 1.5)  # G_{sqrt(E)/sigma}
    assert out["epsilon"] == pytest.approx(want, rel=1e-9)
    assert out["closed_form"]["epsilon"] == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("g", [2, 4, 8])
def test_table1_bounds_hold_and_are_attained_in_the_worst_case(g: int) -> None:
    base = {
        "sampling": "shuffle",
        "num_samples": "2000",
        "epochs": "5",
        "noise_multiplier": "2",
        "target_delta": "1e-5",
        "group_privacy": str(g),
    }
    batch = account("batch-clipping", {**base, "num_groups": "1", "group_size": "20"})
    assert batch["closed_form"]["mu"] == pytest.approx(math.sqrt(g * 5) / 2)
    assert batch["worst_case"]["mu"] == pytest.approx(math.sqrt(g * 5) / 2)  # t_max = g E
    assert batch["epsilon"] <= batch["closed_form"]["epsilon"]
    indiv = account("batch-clipping", {**base, "num_groups": "20", "group_size": "1"})
    assert indiv["closed_form"]["mu"] == pytest.approx(g * math.sqrt(5) / 2)
    assert indiv["worst_case"]["mu"] == pytest.approx(g * math.sqrt(5) / 2)  # t_max = g^2 E
    assert indiv["epsilon"] <= indiv["closed_form"]["epsilon"]
    # batch clipping's exact epsilon is below individual clipping's for the same batch
    assert batch["epsilon"] <= indiv["epsilon"] + 1e-9


def test_group_privacy_sqrt_g_for_batch_clipping() -> None:
    # the exact mu-equivalent grows like sqrt(g) (mean c^2 close to g E) for m = 1
    for g in [1, 2, 4, 8]:
        law = bg.sum_squares_law("shuffle", 60000, 1, 256, 60 * (60000 // 256), g)
        assert law.mean() <= g * 60
        assert law.mean() >= 0.98 * g * 60 * (234 * 256 / 60000)


# --------------------------------------------------------------------------- mixture, calibration
def test_epsilon_is_mixture_of_gaussians() -> None:
    law = bg.sum_squares_law("subsample", 50, 2, 3, 20, 2, tail_tol=0.0)
    d = law.as_dict()
    eps = mix.batch_clipping_epsilon(law, 1.3, 1e-5)
    direct = sum(p * gdp.gdp_delta(eps, math.sqrt(t) / 1.3) for t, p in d.items())
    assert direct <= 1e-5 * (1 + 1e-9)
    assert direct == pytest.approx(1e-5, rel=1e-6)


def test_lumping_is_conservative() -> None:
    exact = bg.sum_squares_law("subsample", 3000, 8, 4, 2000, 4, tail_tol=0.0)
    lumped = bg.sum_squares_law("subsample", 3000, 8, 4, 2000, 4, tail_tol=1e-30)
    assert lumped.lumped_mass <= 1e-30
    assert len(lumped.as_dict()) < len(exact.as_dict())
    e_exact = mix.batch_clipping_epsilon(exact, 2.0, 1e-6)
    e_lumped = mix.batch_clipping_epsilon(lumped, 2.0, 1e-6)
    assert e_exact <= e_lumped <= e_exact * (1 + 1e-9)


def test_calibration_round_trip() -> None:
    out = account(
        "batch-clipping",
        {
            "sampling": "subsample",
            "num_samples": "5000",
            "num_groups": "1",
            "group_size": "50",
            "epochs": "3",
            "group_privacy": "2",
            "target_epsilon": "3",
            "target_delta": "1e-5",
            "analysis": "paper",  # the mixture alone (default: test_batch_clipping_issue40.py)
        },
    )
    sigma = out["noise_multiplier"]
    assert out["calibrated"] == "noise_multiplier" and out["delta"] <= 1e-5
    law = bg.sum_squares_law("subsample", 5000, 1, 50, 300, 2)
    assert mix.batch_clipping_epsilon(law, sigma, 1e-5) <= 3.0
    assert mix.batch_clipping_epsilon(law, 0.99 * sigma, 1e-5) > 3.0


# --------------------------------------------------------------------------- ledger event
def test_event_in_ledger_matches_cli_and_round_trips() -> None:
    ev = bc.BatchClippingEvent("shuffle", 1000, 2, 5, 1.2, group_privacy=3)
    ledger = PrivacyLedger(neighboring_relation="replace_one")
    for _ in range(4):
        ledger.record(ev, 50)  # 2 epochs of 100 rounds
    cli = account(
        "batch-clipping",
        {
            "sampling": "shuffle",
            "num_samples": 1000,
            "num_groups": 2,
            "group_size": 5,
            "epochs": 2,
            "noise_multiplier": 1.2,
            "group_privacy": 3,
            "target_delta": 1e-5,
        },
    )
    assert ledger.get_epsilon(1e-5) == pytest.approx(cli["epsilon"], rel=1e-12)
    again = PrivacyLedger.from_dict(json.loads(json.dumps(ledger.to_dict())))
    assert again.get_epsilon(1e-5) == ledger.get_epsilon(1e-5)
    assert ev.delta(ledger.get_epsilon(1e-5), 200) <= 1e-5
    with pytest.raises(IncompatibleEventsError):
        PrivacyLedger(neighboring_relation="add_remove").record(ev, 1)


# --------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    "params, key",
    [
        ({"sampling": "poisson"}, "sampling"),
        ({"sampling": "shuffle", "num_groups": "20", "group_size": "60"}, "num_groups"),
        ({"sampling": "shuffle", "group_privacy": "2000"}, "group_privacy"),
        ({"sampling": "shuffle", "epochs": "0"}, "epochs"),
        ({"sampling": "shuffle", "noise_multiplier": "-1"}, "noise_multiplier"),
        ({"sampling": "shuffle", "target_delta": "0"}, "target_delta"),
        ({"sampling": "shuffle", "typo": "1"}, "typo"),
    ],
)
def test_refusals_name_the_key(params: dict[str, str], key: str) -> None:
    base = {
        "num_samples": "1000",
        "num_groups": "1",
        "group_size": "10",
        "epochs": "2",
        "noise_multiplier": "1",
        "target_delta": "1e-5",
    }
    with pytest.raises(ConfigError) as err:
        account("batch-clipping", {**base, **params})
    assert str(err.value).startswith(key + "=")


def test_poisson_refusal_points_to_the_right_analysis() -> None:
    with pytest.raises(ConfigError, match="poisson-gaussian"):
        bc.BatchClippingEvent("poisson", 100, 1, 10, 1.0)


def test_no_noise_is_infinite_only_when_touched() -> None:
    law = bg.sum_squares_law("shuffle", 100, 1, 10, 10, 1)
    assert mix.batch_clipping_epsilon(law, 0.0, 1e-5) == math.inf
    assert (
        mix.batch_clipping_epsilon(bg.sum_squares_law("shuffle", 100, 1, 10, 0, 1), 0.0, 1e-5)
        == 0.0
    )


# --------------------------------------------------------------------------- properties
small = dict(
    n=st.integers(20, 300),
    m=st.integers(1, 4),
    s=st.integers(1, 5),
    g=st.integers(1, 4),
    epochs=st.integers(1, 4),
    sigma=st.floats(0.5, 5.0),
    sampling=st.sampled_from(["shuffle", "subsample"]),
)


@settings(max_examples=25, deadline=None)
@given(**small)
def test_epsilon_monotone(
    n: int, m: int, s: int, g: int, epochs: int, sigma: float, sampling: str
) -> None:
    per = n // (m * s)
    if per == 0:
        return

    def eps(g_: int, e_: int, sig: float) -> float:
        law = bg.sum_squares_law(sampling, n, m, s, e_ * per, g_)
        return mix.batch_clipping_epsilon(law, sig, 1e-5)

    base = eps(g, epochs, sigma)
    assert not math.isnan(base) and base >= 0
    assert eps(g, epochs + 1, sigma) >= base - 1e-9
    assert eps(g + 1, epochs, sigma) >= base - 1e-9
    assert eps(g, epochs, sigma * 1.2) <= base + 1e-9
