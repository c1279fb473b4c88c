"""Every public bound of the accounting layers names its source and its hypotheses (issue 40,
item 1(b)).

Walks the modules of ``fedpriv/accounting/{loss_models,samplers,accountants}`` and
``core/lower_bound.py``, ``core/group_privacy.py``. Each public function or class defined there
(``lru_cache`` wrappers included) is a bound unless :data:`NOT_A_BOUND` says why it computes
none. A bound's own docstring (not its module's) must carry

* a SOURCE: an arXiv id or a numbered theorem, lemma, proposition or corollary, and
* its HYPOTHESES: the neighbouring relation (add/remove, replace-one) or the word
  "hypothesis"/"hypotheses" introducing what the bound assumes.

A docstring that names a test (``tests/<file>.py::<test>``) as the place a hypothesis is
checked must name one that exists.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = (
    "fedpriv.accounting.loss_models",
    "fedpriv.accounting.samplers",
    "fedpriv.accounting.accountants",
)
MODULES = ("fedpriv.accounting.core.lower_bound", "fedpriv.accounting.core.group_privacy")

SOURCE = re.compile(
    r"arXiv[:\s]\s*\d{4}\.\d{4,5}"
    r"|\b(?:Theorem|Thm\.?|Lemma|Proposition|Prop\.|Corollary|Cor\.)\s*[A-Z]?\d",
    re.IGNORECASE,
)
HYPOTHESIS = re.compile(
    r"hypothes[ie]s|add/remove|add_remove|replace-one|replace_one|\brelation\b", re.IGNORECASE
)
TEST_REFERENCE = re.compile(r"(tests/[\w/]+\.py)::(\w+)")

#: Public names in scope that compute no bound (``module.name`` relative to
#: ``fedpriv.accounting``), each with the reason.
NOT_A_BOUND = {
    "loss_models.gaussian_mixture.check_noise_multiplier": "input validation",
    "samplers.poisson.integer_orders": "input validation",
    "samplers.batch_groups.validate_sizes": "input validation",
    "samplers.batch_groups.SumSquaresLaw": "container of a law (computed by sum_squares_law)",
    "samplers.batch_groups.occupancy_counts": "exact combinatorial count, brute-force tested",
    "samplers.checkin.PassParams": "a pass's parameters (the bound: single_pass_epsilon)",
    "samplers.fixed_size.dominating_interval": "a loss grid: the PLD dominates at any grid",
    "samplers.random_allocation.allocation_interval": "a loss grid: dominates at any grid",
    "accountants.pld_grid.relative_interval": "a loss grid rule",
    "accountants.pld_grid.sampled_gaussian_loss_rms": "a scale for a loss grid",
    "accountants.rdp.best_over_orders": "a minimiser over orders (each order is a bound)",
    "accountants.composition.smallest_delta": "numerical inverse of a given ε(δ) curve",
    "accountants.monte_carlo.EpsilonEstimate": "container of an estimate",
    "accountants.monte_carlo.log_elementary_symmetric": "numerics (log-space recursion)",
    "accountants.monte_carlo.composed_losses": "samples (the bound: allocation_epsilon_estimate)",
    "accountants.monte_carlo.sample_count": "a sample size",
}


def modules() -> list[ModuleType]:
    """The modules in scope, imported."""
    names = list(MODULES)
    for package in PACKAGES:
        path = importlib.import_module(package).__path__
        names += [f"{package}.{m.name}" for m in pkgutil.iter_modules(path)]
    return [importlib.import_module(name) for name in sorted(names)]


def public_members() -> dict[str, object]:
    """``{module.name: object}`` of the public functions and classes each module defines."""
    out: dict[str, object] = {}
    for module in modules():
        short = module.__name__.removeprefix("fedpriv.accounting.")
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            if inspect.isclass(obj) or inspect.isfunction(inspect.unwrap(obj)):  # type: ignore[arg-type]
                out[f"{short}.{name}"] = obj
    return out


def missing(doc: str | None) -> list[str]:
    """What a bound's docstring lacks: ``"source"``, ``"hypotheses"``, both or neither."""
    text = doc or ""
    return [
        what
        for what, pattern in (("source", SOURCE), ("hypotheses", HYPOTHESIS))
        if not pattern.search(text)
    ]


def failures() -> list[str]:
    """``name: missing [...]`` for every public bound whose docstring lacks something."""
    return [
        f"{name}: missing {gaps}"
        for name, obj in public_members().items()
        if name not in NOT_A_BOUND and (gaps := missing(obj.__doc__))
    ]


def test_every_public_bound_names_its_source_and_hypotheses() -> None:
    assert failures() == []


def test_the_walk_finds_the_bounds() -> None:
    members = public_members()
    for name in (
        "samplers.poisson.poisson_subsampled_rdp",
        "loss_models.skellam_rdp.skellam_rdp",
        "loss_models.skellam_rdp.SkellamEvent",
        "loss_models.discrete_gaussian.DiscreteGaussianEvent",
        "loss_models.gaussian_mixture.batch_clipping_epsilon",
        "samplers.batch_groups.sum_squares_law",  # behind lru_cache
        "samplers.fixed_size.WithoutReplacementGaussianEvent",
        "samplers.random_allocation.RandomAllocationEvent",
        "accountants.gdp.gdp_epsilon",
        "core.group_privacy.group_privacy_epsilon",
        "core.lower_bound.epsilon_lower_bound",
    ):
        assert name in members
    assert len(set(members) - set(NOT_A_BOUND)) >= 40


def test_every_exemption_names_a_live_member_and_a_reason() -> None:
    members = public_members()
    assert [name for name in NOT_A_BOUND if name not in members] == []
    assert all(reason.strip() for reason in NOT_A_BOUND.values())


@pytest.mark.parametrize(
    "name",
    [
        "samplers.poisson.poisson_subsampled_rdp",
        "loss_models.skellam_rdp.SkellamEvent",
        "core.group_privacy.group_privacy_delta",
        "samplers.batch_groups.sum_squares_law",
    ],
)
def test_a_stripped_docstring_fails(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    obj = public_members()[name]
    assert missing(obj.__doc__) == []
    monkeypatch.setattr(obj, "__doc__", None)
    assert f"{name}: missing ['source', 'hypotheses']" in failures()


def test_a_source_alone_or_a_relation_alone_is_not_enough() -> None:
    assert missing("Poisson subsampling (Steinke, arXiv:2210.00597).") == ["hypotheses"]
    assert missing("Holds under add/remove.") == ["source"]
    assert missing("Theorem 3.5; hypotheses: symmetric noise.") == []
    assert missing("Section 5, eq. (6).") == ["source", "hypotheses"]


def test_named_hypothesis_checks_exist() -> None:
    refs = {
        ref
        for obj in public_members().values()
        for ref in TEST_REFERENCE.findall(obj.__doc__ or "")
    }
    assert (
        "tests/test_accounting_skellam.py",
        "test_skellam_bound_dominates_exact_1d_divergence",
    ) in refs
    for path, test in refs:
        assert re.search(rf"^def {test}\(", (REPO / path).read_text(), re.MULTILINE), (path, test)
