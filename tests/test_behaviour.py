"""Behaviour unchanged by the architecture refactor (issue 23, item 11).

``tests/golden/behaviour_400af8e.json`` was recorded on main 400af8e, before the refactor, for
the default run and every ``conf/experiment/*.yaml`` (plus one case per client family): the
resolved σ, ε after round 1 and after ``num_rounds`` composed by the run's ledger, and the rows
of a short run per CPU kind (:data:`CPU`; ``tests/golden/record_rows.py`` records them). The
cases' overrides are in the old spelling; :data:`NEW_SPELLING` maps the ones that changed
(``docs/migration.md``). The fast tier checks σ and ε (no training); the full tier runs each
short run and compares its rows.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from fedpriv.run.config import compose_config
from fedpriv.run.prepare import prepare
from fedpriv.run.run_privacy import RunPrivacy
from tests.shared_ray import run_shared

GOLDEN = json.loads((Path(__file__).parent / "golden" / "behaviour_400af8e.json").read_text())[
    "cases"
]
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
#: Old override -> its new spelling (a key renamed for one family, an option folded away), by
#: case. client=client_level_skellam runs on its own family since issue 28 (the same keys, RDP
#: by default; privacy=client_level with it is refused).
NEW_SPELLING: dict[str, dict[str, str]] = {
    "client_level_skellam": {"privacy=client_level": "privacy=client_level_skellam"},
}
#: Defaults changed deliberately since 400af8e: the overrides that restore the recorded
#: behaviour, by case. Issue 26: Skellam's scale follows the probabilistic rule with rotation
#: (tests/test_skellam_scale_rule.py checks the new default); 400af8e had no_wrap, no rotation.
SKELLAM_CASES = (
    "client_level_skellam",
    "secagg_acs_income",
    "secagg_fmnist_local_steps",
    "skellam_dpsgd",
)
OLD_DEFAULTS: dict[str, list[str]] = {
    name: ["client.scale_rule=no_wrap", "client.rotation=false"] for name in SKELLAM_CASES
}
#: The accountant's figures (σ, ε, local ε) equal the recorded ones to this relative tolerance:
#: float64 arithmetic on no data, identical up to summation order.
RTOL = 1e-9
#: A short run's training figures (float32) move with the CPU's vector kernels and with the
#: numerical libraries' versions that a fresh install resolves: the same seeds and code gave a
#: round-1 loss of 1.2955441, 1.2955376 and 1.2955193 on three machines. They are compared to
#: these tolerances, by figure (a row's or a client metric's): ``(absolute?, tolerance,
#: tolerance for SKELLAM_CASES)``. Skellam's randomized rounding turns a last-digit difference
#: into other integers, so its runs drift as a whole (round-1 accuracy 0.606 and 0.588 for one
#: case): a looser band that still fails on a broken mechanism (an accuracy of chance, a loss
#: off by 5%). A count of clipped updates moves by one when a norm sits at the threshold.
TRAINING_TOL: dict[str, tuple[bool, float, float]] = {
    "accuracy": (True, 0.01, 0.04),
    "block_accuracy": (True, 0.01, 0.04),
    "unclipped_fraction": (True, 0.01, 0.04),
    "loss": (False, 1e-3, 0.05),
    "update_norm": (False, 1e-3, 0.05),
    "clipping_norm": (False, 1e-3, 0.05),
    "clipped": (False, 0.1, 0.2),
}
#: torch's CPU kernels pick their vector width by machine: a float32 loss moves in its 6th digit
#: and, through Skellam's randomized rounding, a whole short run. 400af8e's rows were recorded on
#: an AVX-512 machine and again on an AVX2 one; a run compares with those of its own kind.
CPU = torch.backends.cpu.get_cpu_capability()
COMMON = ["progress=false", "plot=false", "save_model=false", "ray_init_args.num_cpus=2"]


def overrides(name: str, short: bool = False) -> list[str]:
    case = GOLDEN[name]
    given = [*case["overrides"], *(case["short_overrides"] if short else [])]
    given += OLD_DEFAULTS.get(name, [])
    out = []
    for item in given:
        item = NEW_SPELLING.get(name, {}).get(item, item)
        out.append(item.replace("/work/shared/data", str(SHARED)))
    return [*out, *COMMON]


def needs_shared(case: dict[str, Any]) -> bool:
    return any("/work/shared/data" in o for o in case["overrides"])


#: Cases whose full-run ε takes over 10 s to compose (the random-allocation PLD): full tier; the
#: allocation and check-in analyses keep fast tests of their own (test_client_level.py,
#: test_checkin_gaussian.py, tests/test_contract_specs.py).
SLOW_EPSILON = {"client_level_fmnist_allocation", "checkin_gaussian"}
#: Deliberate changes since 400af8e, each with the issue that made it: in these cases a round's
#: ε must equal its run's spec's ε for that many rounds (rel. RTOL) and never exceed the
#: recorded one (a tighter valid analysis); every other figure is still compared as recorded.
TIGHTER_EPSILON = {
    "client_level_fmnist_allocation": "issue 25: an epoch is charged for its released rounds",
    "batch_clipping_vs_dpsgd_individual": (
        "issue 40: subsampling is accounted by the fixed-size sampled Gaussian PLD, groups by "
        "the smaller of the paper's mixture and group privacy (the rows' epsilon_g{g} too)"
    ),
}


def expected_group_epsilons(name: str, spec: Any, row: dict[str, Any]) -> dict[str, Any]:
    """A recorded row with, for :data:`TIGHTER_EPSILON`, its ``epsilon_g{g}`` replaced by the
    spec's report for that round, each checked to be no more than the recorded one."""
    if name not in TIGHTER_EPSILON or not any(k.startswith("epsilon_g") for k in row):
        return row
    report = spec.report(row["server_round"])
    tighter = {k: v for k, v in report.items() if k in row and not k.endswith("_closed")}
    for key, eps in tighter.items():
        assert eps <= row[key] * (1 + RTOL), (name, key, eps, row[key])
    return {**row, **tighter}


def expected_epsilon(name: str, spec: Any, server_round: int, recorded: float) -> float:
    """The ε a round must report: the recorded one, or (:data:`TIGHTER_EPSILON`) the spec's,
    checked here to be no more than the recorded one."""
    if name not in TIGHTER_EPSILON:
        return recorded
    eps = float(spec.epsilon(server_round))
    assert eps <= recorded * (1 + RTOL), (name, server_round, eps, recorded)
    return eps


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_EPSILON else n for n in sorted(GOLDEN)],
)
def test_resolved_noise_and_epsilon_are_unchanged(name: str) -> None:
    case = GOLDEN[name]
    if needs_shared(case) and not SHARED.is_dir():
        pytest.skip(f"{SHARED} not present")
    plan, algorithm = prepare(compose_config(overrides(name)))
    noise = plan.privacy.summary().get("noise_multiplier")
    want = case["noise_multiplier"]
    assert (noise is None) == (want is None)
    if want is not None:
        assert noise == pytest.approx(want, rel=RTOL)
    privacy = RunPrivacy(plan.privacy, plan.cohort.nominal_size)
    got = []
    for r in range(1, plan.num_rounds + 1):
        privacy.record_round(None, r)
        if r in (1, plan.num_rounds):
            got.append([r, privacy.epsilon()])
    for (r, eps), (r0, eps0) in zip(got, case["epsilon_full"], strict=True):
        want = expected_epsilon(name, plan.privacy, r, eps0)
        assert r == r0 and eps == pytest.approx(want, rel=RTOL), (name, r)
    local = privacy.local_epsilon()
    if case["local_epsilon_full"] is None:
        assert local is None
    else:
        assert local == pytest.approx(case["local_epsilon_full"], rel=RTOL)


def same(a: Any, b: Any, key: str = "", name: str = "") -> bool:
    """Whether figure ``key`` of case ``name`` equals the recorded one (:data:`RTOL`, or for a
    training figure :data:`TRAINING_TOL`); dicts (``client_metrics``) key by key."""
    if key in TRAINING_TOL and isinstance(a, float) and isinstance(b, float):
        absolute, tol, skellam_tol = TRAINING_TOL[key]
        tol = skellam_tol if name in SKELLAM_CASES else tol
        return abs(a - b) <= tol if absolute else math.isclose(a, b, rel_tol=tol)
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=RTOL) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return all(k in b and same(v, b[k], k, name) for k, v in a.items())
    return a == b


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_short_run_rows_are_unchanged(name: str, tmp_path: Path, shared_ray: str) -> None:
    case = GOLDEN[name]
    if needs_shared(case) and not SHARED.is_dir():
        pytest.skip(f"{SHARED} not present")
    if CPU not in case["rounds"]:
        pytest.skip(f"400af8e's rows were recorded on {sorted(case['rounds'])} CPUs, not {CPU}")
    cfg = compose_config(overrides(name, short=True))
    summary = run_shared(cfg, tmp_path / "run", shared_ray)
    assert summary["status"] == "complete"
    rows = case["rounds"][CPU]
    assert len(summary["rounds"]) == len(rows)
    spec = prepare(cfg)[0].privacy
    for got, want in zip(summary["rounds"], rows, strict=True):
        want = expected_group_epsilons(name, spec, want)
        if "epsilon" in want:
            want = {
                **want,
                "epsilon": expected_epsilon(name, spec, got["server_round"], want["epsilon"]),
            }
        assert {"status", "epsilon"} & set(want) <= set(got)
        assert {"accuracy", "loss", "local_epsilon"} & set(want) <= set(got)
        diff = [k for k, v in want.items() if k in got and not same(got[k], v, k, name)]
        assert diff == [], (name, want["server_round"], {k: (got[k], want[k]) for k in diff})
