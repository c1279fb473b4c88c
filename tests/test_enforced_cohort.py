"""Server-enforced participation (:mod:`fedpriv.mechanisms.enforced_cohort`): no enforced cohort
ever breaks the accounted pattern, whatever proposes it (samplers, clients choosing their own
rounds, device availability); the cyclic groups are Poisson-q; the state replays
deterministically; nothing is removed needlessly; bad input is refused in one line."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedpriv.common.errors import ConfigError
from fedpriv.mechanisms.client_sampling import CohortSampler
from fedpriv.mechanisms.enforced_cohort import (
    AvailabilityTrace,
    EnforcedCohort,
    ExplicitAvailability,
    PatternViolation,
    check_pattern,
    cyclic_groups,
)
from fedpriv.mechanisms.participation import Participation

N, ROUNDS, SEED = 500, 300, 11
BAD_SEED: Any = 1.5

SAMPLERS = {
    "all": CohortSampler(N, seed=SEED),
    "poisson": CohortSampler(N, "poisson", client_sample_rate=0.3, seed=SEED),
    "fixed_size": CohortSampler(N, "fixed_size", num_sampled_clients=120, seed=SEED),
    # clients choose their own 2 rounds of every 10 (random check-ins as participation)
    "random_allocation": CohortSampler(
        N, "random_allocation", allocation_window=10, rounds_per_client=2, seed=SEED
    ),
}


def poisson(q: float) -> CohortSampler:
    """The run's Poisson sampler at rate q (cyclic Poisson keeps the round's group of it)."""
    return CohortSampler(N, "poisson", client_sample_rate=q, seed=SEED)


PATTERNS = {
    "single": Participation(kind="single"),
    "k3_b5": Participation(kind="min_separation", max_participations=3, min_separation=5),
    "k10_b1": Participation(kind="min_separation", max_participations=10, min_separation=1),
    "k2_b50": Participation(kind="min_separation", max_participations=2, min_separation=50),
    "k100_b7": Participation(kind="min_separation", max_participations=100, min_separation=7),
}
DIURNAL = AvailabilityTrace(period=24, available_fraction=0.4, seed=3)


def history_of(cohort: EnforcedCohort, rounds: int = ROUNDS) -> list[np.ndarray]:
    return [cohort.draw(t) for t in range(1, rounds + 1)]


def counts_of(history: list[np.ndarray], n: int = N) -> np.ndarray:
    return np.bincount(np.concatenate([*history, np.empty(0, np.int64)]), minlength=n)


# ---------------------------------------------------------------------------------------------
# the pattern is never broken


@pytest.mark.parametrize("available", [None, DIURNAL], ids=["always", "diurnal"])
@pytest.mark.parametrize("pattern", list(PATTERNS))
@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_no_client_ever_breaks_the_pattern(
    sampler: str, pattern: str, available: AvailabilityTrace | None
) -> None:
    p = PATTERNS[pattern]
    enforced = EnforcedCohort(SAMPLERS[sampler], p, availability=available, seed=SEED)
    history = history_of(enforced)
    check_pattern(history, p)
    for ids in history:
        assert ids.dtype == np.int64 and np.all(np.diff(ids) > 0)
    counts = counts_of(history)
    assert counts.max() <= p.max_participations_in(ROUNDS)
    assert np.array_equal(enforced.participations(), counts)  # conservative counting: cohort
    assert counts.sum() > 0
    if available is not None:
        for t, ids in enumerate(history, start=1):
            assert DIURNAL.available(t, N)[ids].all()


def _proposal(sampler: CohortSampler, t: int, available: AvailabilityTrace | None) -> np.ndarray:
    ids = sampler.draw(t)
    return ids if available is None else ids[available.available(t, N)[ids]]


@pytest.mark.parametrize("available", [None, DIURNAL], ids=["always", "diurnal"])
@pytest.mark.parametrize("pattern", ["single", "k3_b5", "k2_b50"])
@pytest.mark.parametrize("sampler", ["poisson", "random_allocation"])
def test_only_clients_that_would_break_the_pattern_are_removed(
    sampler: str, pattern: str, available: AvailabilityTrace | None
) -> None:
    p, s = PATTERNS[pattern], SAMPLERS[sampler]
    k = p.max_participations or 1
    enforced = EnforcedCohort(s, p, availability=available, seed=SEED)
    last = np.full(N, -(10**9))
    count = np.zeros(N, dtype=np.int64)
    for t in range(1, ROUNDS + 1):
        proposed = _proposal(s, t, available)
        ids = enforced.draw(t)
        assert np.isin(ids, proposed).all()
        removed = np.setdiff1d(proposed, ids)
        would_break = (count[removed] >= k) | (t - last[removed] < p.separation)
        assert would_break.all(), f"round {t}: removed {removed[~would_break]} needlessly"
        count[ids] += 1
        last[ids] = t


def test_with_b1_and_k_n_every_client_takes_part_every_round() -> None:
    p = Participation(kind="min_separation", max_participations=ROUNDS, min_separation=1)
    enforced = EnforcedCohort(SAMPLERS["all"], p, seed=SEED)
    for ids in history_of(enforced):
        assert ids.tolist() == list(range(N))
    assert (enforced.participations() == ROUNDS).all()
    assert enforced.expected_cohort_size(ROUNDS) == float(N)


def test_single_with_all_sampler_is_everyone_once() -> None:
    enforced = EnforcedCohort(SAMPLERS["all"], PATTERNS["single"], seed=SEED)
    assert enforced.draw(1).tolist() == list(range(N))
    assert enforced.draw(2).size == 0 and enforced.draw(ROUNDS).size == 0
    assert (enforced.participations() == 1).all()


# ---------------------------------------------------------------------------------------------
# cyclic Poisson


@pytest.mark.parametrize("available", [None, DIURNAL], ids=["always", "diurnal"])
@pytest.mark.parametrize(("b", "q"), [(1, 0.2), (4, 0.2), (7, 0.5), (5, 1.0)])
def test_cyclic_poisson_keeps_each_client_in_its_group_at_rate_q(
    b: int, q: float, available: AvailabilityTrace | None
) -> None:
    p = Participation(kind="cyclic_poisson", min_separation=b, client_sample_rate=q)
    enforced = EnforcedCohort(poisson(q), p, availability=available, seed=SEED)
    groups = enforced.groups
    assert groups is not None and np.array_equal(groups, cyclic_groups(N, b, SEED))
    assert np.ptp(np.bincount(groups, minlength=b)) <= 1  # balanced public partition
    history = history_of(enforced)
    check_pattern(history, p, groups=groups)
    hits, trials = np.zeros(b), np.zeros(b)
    for t, ids in enumerate(history, start=1):
        g = (t - 1) % b
        assert (groups[ids] == g).all(), f"round {t} holds a client of another group"
        members = groups == g
        if available is not None:
            members &= available.available(t, N)
        hits[g] += ids.size
        trials[g] += members.sum()
    # each (available) group member is drawn independently with probability q: the frequency
    # per group is Binomial(trials, q) / trials; allow 5 standard deviations (+ 1e-12 at q = 1)
    freq = hits / trials
    tolerance = 5 * np.sqrt(q * (1 - q) / trials) + 1e-12
    assert (np.abs(freq - q) <= tolerance).all(), (freq, tolerance)
    assert enforced.participations().max() <= p.max_participations_in(ROUNDS)


def test_cyclic_groups_depend_on_the_seed_only() -> None:
    a, b = cyclic_groups(N, 6, SEED), cyclic_groups(N, 6, SEED)
    assert np.array_equal(a, b) and not np.array_equal(a, cyclic_groups(N, 6, SEED + 1))
    assert sorted(set(a.tolist())) == list(range(6))


def test_cyclic_expected_cohort_size_is_about_q_n_over_b_through_a_dry_run() -> None:
    p = Participation(kind="cyclic_poisson", min_separation=4, client_sample_rate=0.4)
    enforced = EnforcedCohort(poisson(0.4), p, seed=SEED)
    enforced.draw(5)
    before = enforced.participations()
    mean = enforced.expected_cohort_size(ROUNDS)
    assert np.array_equal(enforced.participations(), before)  # the dry run is separate
    assert enforced.last_round == 5
    assert mean == pytest.approx(np.mean([x.size for x in history_of(enforced)]))
    assert mean == pytest.approx(0.4 * N / 4, rel=0.05)


# ---------------------------------------------------------------------------------------------
# replay


REPLAY_CASES = {
    "poisson_k3_b5_diurnal": (SAMPLERS["poisson"], PATTERNS["k3_b5"], DIURNAL),
    "allocation_k2_b50": (SAMPLERS["random_allocation"], PATTERNS["k2_b50"], None),
    "fixed_single": (SAMPLERS["fixed_size"], PATTERNS["single"], None),
    "cyclic": (
        CohortSampler(N, "poisson", client_sample_rate=0.3, seed=SEED),
        Participation(kind="cyclic_poisson", min_separation=3, client_sample_rate=0.3),
        DIURNAL,
    ),
}


@pytest.mark.parametrize("case", list(REPLAY_CASES))
def test_draw_replays_deterministically_from_seed_and_round(case: str) -> None:
    sampler, p, available = REPLAY_CASES[case]
    stepped = EnforcedCohort(sampler, p, availability=available, seed=SEED)
    steps = [stepped.draw(t) for t in range(1, 58)]
    direct = EnforcedCohort(sampler, p, availability=available, seed=SEED)
    assert np.array_equal(direct.draw(57), steps[-1])  # a resumed run: replays 1..56
    assert np.array_equal(direct.participations(), stepped.participations())
    again = direct.draw(57)
    assert np.array_equal(again, steps[-1])  # the same round twice: the same cohort
    again[:] = -1  # a copy: the caller cannot corrupt the cached cohort
    assert np.array_equal(direct.draw(57), steps[-1])
    assert np.array_equal(direct.draw(20), steps[19])  # an earlier round: restart from 1
    assert np.array_equal(direct.participations(), counts_of(steps[:20]))
    assert direct.last_round == 20
    assert np.array_equal(direct.draw(57), steps[-1])
    reseeded = dataclasses.replace(sampler, seed=SEED + 1)
    other = EnforcedCohort(reseeded, p, availability=available, seed=SEED + 1)
    assert any(not np.array_equal(other.draw(t), steps[t - 1]) for t in (1, 2, 3, 57))


def test_expected_cohort_size_matches_the_mean_of_the_draws() -> None:
    s, p = SAMPLERS["poisson"], PATTERNS["k3_b5"]
    enforced = EnforcedCohort(s, p, availability=DIURNAL, seed=SEED)
    sizes = [x.size for x in history_of(enforced, 100)]
    fresh = EnforcedCohort(s, p, availability=DIURNAL, seed=SEED)
    nonempty = [x for x in sizes if x]  # a round with an empty cohort releases nothing
    assert fresh.expected_cohort_size(100) == pytest.approx(np.mean(nonempty))
    assert fresh.empty_rounds == len(sizes) - len(nonempty)
    assert fresh.last_round == 0


# ---------------------------------------------------------------------------------------------
# availability


def test_diurnal_trace_is_periodic_seeded_and_about_the_fraction_available() -> None:
    tr = AvailabilityTrace(period=24, available_fraction=0.3, seed=5)
    masks = np.stack([tr.available(t, 2000) for t in range(1, 49)])
    assert masks.dtype == np.bool_ and masks.shape == (48, 2000)
    assert np.array_equal(masks[:24], masks[24:])  # one day repeats
    # the mean window is 0.3 * 24 rounds: sd of the mean of 2000 Binomial(24, .3) / 24 ~ .002
    assert masks.mean() == pytest.approx(0.3, abs=0.015)
    runs = masks[:24].sum(axis=0)
    assert runs.std() > 0  # windows differ between clients
    offsets, windows = tr.windows(2000)
    assert offsets.min() >= 0 and offsets.max() < 24 and windows.max() <= 24
    assert np.array_equal(runs, windows)  # a client is up exactly window_i rounds a day
    same = AvailabilityTrace(period=24, available_fraction=0.3, seed=5)
    assert np.array_equal(same.available(7, 2000), masks[6])
    other = AvailabilityTrace(period=24, available_fraction=0.3, seed=6)
    assert not np.array_equal(other.available(7, 2000), masks[6])
    assert AvailabilityTrace(period=24, available_fraction=1.0).available(3, 50).all()


def test_explicit_trace_from_npy_is_obeyed_and_its_end_is_refused(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    mask = rng.random((40, N)) < 0.5
    path = tmp_path / "trace.npy"
    np.save(path, mask)
    trace = ExplicitAvailability.from_npy(path)
    assert trace.num_rounds == 40 and trace.num_clients == N
    p = PATTERNS["k3_b5"]
    enforced = EnforcedCohort(SAMPLERS["all"], p, availability=trace, seed=SEED)
    history = history_of(enforced, 40)
    check_pattern(history, p)
    for t, ids in enumerate(history, start=1):
        assert mask[t - 1][ids].all()
    with pytest.raises(ConfigError, match=r"^availability\.num_rounds=40 is too short"):
        enforced.draw(41)
    with pytest.raises(ConfigError, match=r"^availability\.num_rounds=40"):
        EnforcedCohort(SAMPLERS["all"], p, availability=trace, seed=SEED).expected_cohort_size(50)
    with pytest.raises(ConfigError, match=r"^availability\.num_clients=500 must equal"):
        EnforcedCohort(CohortSampler(N + 1), p, availability=trace, seed=SEED)
    with pytest.raises(ConfigError, match=r"^availability\.path="):
        ExplicitAvailability.from_npy(tmp_path / "missing.npy")
    assert ExplicitAvailability(mask.astype(np.int8)).mask.dtype == np.bool_


# ---------------------------------------------------------------------------------------------
# the checker itself


def _viol(
    history: list[list[int]], p: Participation, groups: np.ndarray | None = None
) -> PatternViolation:
    with pytest.raises(PatternViolation) as info:
        check_pattern([np.asarray(h, dtype=np.int64) for h in history], p, groups=groups)
    return info.value


def test_check_pattern_names_the_client_and_rounds_of_a_violation() -> None:
    v = _viol([[1, 2], [], [2]], PATTERNS["single"])
    assert (v.client, v.rounds) == (2, (1, 3)) and "more than 1" in str(v)
    v = _viol([[4], [], [], [], [4]], PATTERNS["k3_b5"])  # 4 apart < b = 5
    assert (v.client, v.rounds) == (4, (1, 5)) and str(v).startswith("client 4 in rounds [1, 5]")
    check_pattern([[4], [], [], [], [], [4]], PATTERNS["k3_b5"])  # 5 apart: fine
    v = _viol([[0]] * 11, PATTERNS["k10_b1"])
    assert v.client == 0 and v.rounds == tuple(range(1, 12))
    v = _viol([[3, 3]], PATTERNS["k10_b1"])
    assert v.client == 3 and "2 times in round 1" in str(v)
    cyc = Participation(kind="cyclic_poisson", min_separation=3, client_sample_rate=0.5)
    check_pattern([[1], [], [], [1], [], [], [1]], cyc)
    v = _viol([[1], [], [], [], [1]], cyc)  # 4 apart: two different groups
    assert v.rounds == (1, 5) and "multiple of 3" in str(v)
    groups = np.array([0, 1, 2])
    check_pattern([[0], [1], [2], [0]], cyc, groups=groups)
    v = _viol([[0], [2]], cyc, groups=groups)
    assert v.client == 2 and "not of its group 2" in str(v)


# ---------------------------------------------------------------------------------------------
# bad input: one line naming the field


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: AvailabilityTrace(period=0, available_fraction=0.5), "availability.period"),
        (lambda: AvailabilityTrace(period=2.5, available_fraction=0.5), "availability.period"),
        (
            lambda: AvailabilityTrace(period=24, available_fraction=0.0),
            "availability.available_fraction",
        ),
        (
            lambda: AvailabilityTrace(period=24, available_fraction=float("nan")),
            "availability.available_fraction",
        ),
        (
            lambda: AvailabilityTrace(period=24, available_fraction=1.5),
            "availability.available_fraction",
        ),
        (lambda: ExplicitAvailability(np.ones(5, dtype=bool)), "availability.mask"),
        (lambda: ExplicitAvailability(np.full((2, 3), 2)), "availability.mask"),
        (lambda: ExplicitAvailability(np.zeros((0, 3), dtype=bool)), "availability.mask"),
        (
            lambda: EnforcedCohort(
                SAMPLERS["all"],
                Participation(kind="cyclic_poisson", min_separation=2, client_sample_rate=0.3),
                seed=SEED,
            ),
            "client_sampling",
        ),
        (
            lambda: EnforcedCohort(SAMPLERS["all"], PATTERNS["single"], seed=BAD_SEED),
            "seed",
        ),
        (
            lambda: EnforcedCohort(SAMPLERS["all"], PATTERNS["single"], seed=SEED).draw(0),
            "server_round",
        ),
        (
            lambda: EnforcedCohort(
                SAMPLERS["all"], PATTERNS["single"], seed=SEED
            ).expected_cohort_size(0),
            "num_rounds",
        ),
    ],
)
def test_bad_input_is_one_line_naming_the_field(build: object, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        build()  # type: ignore[operator]
    assert info.value.field == field
    message = str(info.value)
    assert message.startswith(f"{field}=") and "\n" not in message


def test_refused_message_for_cyclic_with_a_sampler_names_the_way_out() -> None:
    p = Participation(kind="cyclic_poisson", min_separation=2, client_sample_rate=0.3)
    with pytest.raises(ConfigError, match=r"^client_sampling='all' must be poisson"):
        EnforcedCohort(SAMPLERS["all"], p, seed=SEED)
    with pytest.raises(ConfigError, match=r"^client_sampling='poisson' must be poisson"):
        EnforcedCohort(poisson(0.5), p, seed=SEED)  # another rate than the accounted q


def test_binomial_tolerance_is_meaningful() -> None:
    # the cyclic test's tolerance (5 sd) is tight enough to catch a wrong rate: at b = 4,
    # q = 0.2 a group has 125 clients x 75 rounds of trials, 5 sd ~ 0.02 << 0.2
    assert 5 * math.sqrt(0.2 * 0.8 / (125 * 75)) < 0.025
