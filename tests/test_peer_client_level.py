"""Pure accounting of benchmarks/peer_client_level/compare.py (no pfl import, no training).

Settings of the pfl comparison (issue 13 item 6): 6,000 clients, cohorts of 120, σ = 1, C = 1,
δ = 1e-5. Long compositions are shortened where the claim does not depend on the length.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "peer_client_level" / "compare.py"
_spec = importlib.util.spec_from_file_location("peer_client_level_compare", PATH)
assert _spec is not None and _spec.loader is not None
compare = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = compare
_spec.loader.exec_module(compare)

N, M, SIGMA, DELTA = 6000, 120, 1.0, 1e-5


def test_cyclic_matches_closed_form_gaussian():
    # 500 rounds of a cycle of 120 over 6000: every client in exactly 10 rounds, each a Gaussian
    # with mean shift 2C over std σC; composed: one Gaussian with μ = 2·sqrt(10)/σ. Reference:
    # Balle-Wang closed form (independent of dp-accounting). Tolerance 0.5% (PLD grid).
    assert compare.cyclic_participations(N, M, 500) == 10
    assert compare.cyclic_participations(N, M, 501) == 11
    got = compare.cyclic_replace_one_epsilon_pld(N, M, SIGMA, 500, DELTA)
    ref = compare.gaussian_epsilon_analytic(2 * math.sqrt(10) / SIGMA, DELTA)
    assert got == pytest.approx(ref, rel=5e-3)
    assert ref == pytest.approx(46.21, abs=0.01)


def test_mixture_lower_bound_reproduces_poisson_pld_from_below():
    # Poisson add/remove pair (1-q)N(0,1)+qN(1,1) vs N(0,1) is dp-accounting's own dominating
    # pair for the Poisson-subsampled Gaussian: the rounded-down numeric ε must sit just below
    # dp-accounting's pessimistic PLD ε (within 2%, never above it by more than 1e-3).
    q, steps = M / N, 100
    lower = compare.mixture_pair_epsilon_lower([(1 - q, 0.0), (q, 1.0)], [(1.0, 0.0)], steps, DELTA)
    upper = compare.poisson_epsilon_pld(q, SIGMA, steps, DELTA)
    assert lower <= upper + 1e-3
    assert lower == pytest.approx(upper, rel=2e-2)


def test_plain_gaussian_lower_bound_matches_closed_form():
    # No sampling: N(1,1) vs N(0,1) composed 10 times = one Gaussian with μ = sqrt(10).
    lower = compare.mixture_pair_epsilon_lower([(1.0, 1.0)], [(1.0, 0.0)], 10, DELTA)
    ref = compare.gaussian_epsilon_analytic(math.sqrt(10), DELTA)
    assert lower <= ref + 1e-3
    assert lower == pytest.approx(ref, rel=5e-3)


def test_wor_replace_one_is_not_below_poisson():
    # Fixed-size WOR under replace-one (noise multiplier σ/2 for the 2C sensitivity): its RDP
    # bound and even its lower bound exceed the Poisson add/remove ε (PLD and RDP) at 500 rounds.
    rounds = 500
    pois_pld = compare.poisson_epsilon_pld(M / N, SIGMA, rounds, DELTA)
    pois_rdp = compare.poisson_epsilon_rdp(M / N, SIGMA, rounds, DELTA)
    wor_rdp = compare.wor_replace_one_epsilon_rdp(N, M, SIGMA, rounds, DELTA)
    wor_low = compare.wor_epsilon_lower(N, M, SIGMA, rounds, DELTA)
    assert pois_pld < pois_rdp  # PLD is tighter than RDP for the same event
    assert wor_low <= wor_rdp  # a lower bound cannot exceed a valid upper bound
    assert wor_low > 1.3 * pois_pld
    assert wor_rdp > pois_rdp


def test_wor_event_uses_half_sigma():
    # Halving the event's noise multiplier is what makes the 2C replace-one sensitivity count:
    # passing σ itself must give a strictly smaller ε (the under-report this guards against).
    import dp_accounting

    acc = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
    )
    full = dp_accounting.SampledWithoutReplacementDpEvent(N, M, dp_accounting.GaussianDpEvent(1.0))
    eps_sigma = acc.compose(full, 100).get_epsilon(DELTA)
    assert compare.wor_replace_one_epsilon_rdp(N, M, SIGMA, 100, DELTA) > 1.5 * eps_sigma


@pytest.mark.slow  # ~12 s of lower-bound numerics
def test_with_replacement_pair_and_lower_bound():
    p, q = compare.with_replacement_pair(N, M, SIGMA)
    assert sum(w for w, _ in p) == pytest.approx(1.0, abs=1e-12)
    assert p[0][0] == pytest.approx((1 - 1 / N) ** M, rel=1e-12)  # client in no slot
    assert [m for _, m in p] == [-m for _, m in q]
    # pfl's `random` sampler: the lower bound from one neighbouring pair already exceeds what
    # pfl's accountants print for q = 0.02 (Poisson, add/remove) at 500 rounds.
    low = compare.with_replacement_epsilon_lower(N, M, SIGMA, 500, DELTA)
    assert low > compare.poisson_epsilon_pld(M / N, SIGMA, 500, DELTA) + 1.0
    assert low > compare.poisson_epsilon_rdp(M / N, SIGMA, 500, DELTA) + 0.5


def test_wor_lower_bound_is_dp_accountings_replace_one_pair_rounded_down():
    # The one-pair lower bound for fixed-size WOR evaluates dp-accounting's own Poisson
    # REPLACE_ONE pair; rounding down vs its pessimistic rounding up: below it, within 2%.
    steps = 200
    lower = compare.wor_epsilon_lower(N, M, SIGMA, steps, DELTA)
    upper = compare.poisson_replace_one_epsilon_pld(M / N, SIGMA, steps, DELTA)
    assert lower <= upper + 1e-3
    assert lower == pytest.approx(upper, rel=2e-2)
