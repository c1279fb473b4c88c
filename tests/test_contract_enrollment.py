"""Every member of a contract family is in its contract test (issue 23, item 6).

A new event class, aggregator, ``conf/client/*.yaml`` option or privacy family fails this
test until a contract class covers it (tests/contracts.py: EventContract, AggregatorContract,
ClientAlgorithmContract, PrivacySpecContract), as dp-accounting's accountant tests cover
every accountant.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest
from dp_accounting import dp_event

import fedpriv
import strategies
from fedpriv.accounting.core.event import FedprivEvent, IntegerRdpEvent, PldEvent
from fedpriv.accounting.core.privacy_spec import PrivacySpec
from fedpriv.run.aggregation import Aggregator
from fedpriv.run.config import conf_dir
from tests.contracts import (
    AggregatorContract,
    ClientAlgorithmContract,
    EventContract,
    PrivacySpecContract,
)

TESTS = Path(__file__).parent
#: Abstract bases of the event classes (no event of their own).
ABSTRACT_EVENTS = {FedprivEvent, PldEvent, IntegerRdpEvent}
#: dp-accounting events fedpriv's specs state (a Gaussian, and its Poisson-subsampled form).
DP_EVENTS = {dp_event.GaussianDpEvent, dp_event.PoissonSampledDpEvent}


def import_all() -> None:
    """Import every module of the core, the strategies and the tests (so that every class and
    every contract subclass exists)."""
    for package in (fedpriv, strategies):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if not info.name.endswith("__main__"):
                importlib.import_module(info.name)
    for path in sorted(TESTS.glob("test_*.py")):
        importlib.import_module(f"tests.{path.stem}")


def subclasses(cls: type) -> set[type]:
    out: set[type] = set()
    for sub in cls.__subclasses__():
        out |= {sub} | subclasses(sub)
    return out


def contracts(base: type) -> set[type]:
    return {c for c in subclasses(base) if c.__name__.startswith("Test")}


@pytest.fixture(scope="module", autouse=True)
def _everything() -> None:
    import_all()


def test_every_event_class_has_a_contract() -> None:
    mine = {c for c in subclasses(FedprivEvent) if c.__module__.startswith("fedpriv.")}
    events = (mine - ABSTRACT_EVENTS) | DP_EVENTS
    covered = {c.event_class for c in contracts(EventContract)}
    assert sorted(e.__name__ for e in events - covered) == []


def test_every_aggregator_has_a_contract() -> None:
    aggregators = {c for c in subclasses(Aggregator) if not c.__module__.startswith("tests.")}
    covered = {c.aggregator_class for c in contracts(AggregatorContract)}
    assert sorted(a.__name__ for a in aggregators - covered) == []


def test_every_client_option_has_a_contract() -> None:
    options = {p.stem for p in (conf_dir() / "client").glob("*.yaml")} - {"custom"}
    covered = set()
    for c in contracts(ClientAlgorithmContract):
        for item in c.overrides:
            if found := re.fullmatch(r"client=(\w+)", item):
                covered.add(found.group(1))
    assert sorted(options - covered) == []


def test_every_privacy_family_has_a_contract() -> None:
    families = {p.stem for p in (conf_dir() / "privacy").glob("*.yaml")}
    specs = {c for c in subclasses(PrivacySpec) if not c.__module__.startswith("tests.")}
    assert {s.family for s in specs} >= families
    covered = {c.spec_class for c in contracts(PrivacySpecContract)}
    assert sorted(s.__name__ for s in specs - covered) == []
