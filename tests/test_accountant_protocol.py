"""The accountant protocol (issue 40, item 1(c)): every accountant answers behind
``EventAccountant``, the ledger's answer is the chosen accountant's, and the Monte Carlo
estimate is registered but never answers a budget."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from dp_accounting import dp_event
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from fedpriv.accounting.accountants.gdp import ExactGaussianAccountant, gdp_epsilon
from fedpriv.accounting.accountants.monte_carlo import (
    MonteCarloEstimate,
    allocation_epsilon_estimate,
)
from fedpriv.accounting.accountants.pld import PldAccountant
from fedpriv.accounting.accountants.rdp import RdpAccountant
from fedpriv.accounting.accountants.registry import BUDGET_ACCOUNTANTS, REGISTRY
from fedpriv.accounting.core.accountant import AccountingSettings, OwnAnalysis
from fedpriv.accounting.core.event import FedprivEvent, PldEvent
from fedpriv.accounting.core.ledger import PrivacyLedger
from fedpriv.accounting.dpsgd import poisson_gaussian_event
from fedpriv.accounting.loss_models.skellam_rdp import SkellamEvent
from fedpriv.accounting.samplers.random_allocation import RandomAllocationEvent

STEP = poisson_gaussian_event(1.1, 0.01)


@dataclasses.dataclass(frozen=True)
class GaussianPldEvent(PldEvent):
    """A test-only PLD event: the unsampled Gaussian's PLD."""

    sigma: float

    def pld(self) -> Any:
        return pld_lib.from_gaussian_mechanism(self.sigma)


@dataclasses.dataclass(frozen=True)
class OwnOnlyEvent(FedprivEvent):
    """A test-only event that knows only its own (ε, δ)."""

    eps0: float

    def epsilon(self, target_delta: float, count: int = 1) -> float:
        return count * self.eps0

    def delta(self, target_epsilon: float, count: int = 1) -> float:
        return 0.0 if target_epsilon >= count * self.eps0 else 1.0


def test_every_accountant_has_the_protocol() -> None:
    for name, factory in REGISTRY.items():
        acc = factory(AccountingSettings())
        for member in ("refusal", "epsilon", "delta", "analysis"):
            assert callable(getattr(acc, member)), (name, member)
        assert isinstance(acc.upper_bound, bool), name


def test_only_upper_bounds_answer_a_budget() -> None:
    assert all(f(AccountingSettings()).upper_bound for f in BUDGET_ACCOUNTANTS.values())
    assert MonteCarloEstimate.upper_bound is False
    assert MonteCarloEstimate not in BUDGET_ACCOUNTANTS.values()


@pytest.mark.parametrize(
    ("accountant", "conversion", "runs", "chosen"),
    [
        ("pld", "default", ((STEP, 1000),), PldAccountant),
        ("rdp", "default", ((STEP, 1000),), RdpAccountant),
        ("rdp", "mironov", ((SkellamEvent(100.0, 10.0, 3.0, 0.1), 50), (STEP, 20)), RdpAccountant),
        ("pld", "default", ((dp_event.GaussianDpEvent(2.0), 10),), ExactGaussianAccountant),
        ("pld", "default", ((GaussianPldEvent(2.0), 3),), PldAccountant),
        ("rdp", "default", ((OwnOnlyEvent(0.5), 3),), OwnAnalysis),
    ],
)
def test_the_ledger_answers_what_its_accountant_answers(
    accountant: str, conversion: str, runs: tuple[tuple[Any, int], ...], chosen: type
) -> None:
    ledger = PrivacyLedger(accountant, conversion)
    for event, count in runs:
        ledger.record(event, count)
    acc = chosen(AccountingSettings(conversion))
    assert acc.refusal(ledger.runs) is None
    assert ledger.get_epsilon(1e-5) == acc.epsilon(ledger.runs, 1e-5)
    assert ledger.get_delta(1.0) == acc.delta(ledger.runs, 1.0)
    assert ledger.analysis() == acc.analysis(ledger.runs)


def test_exact_gaussian_is_mu_gdp() -> None:
    runs = ((dp_event.GaussianDpEvent(2.0), 4), (dp_event.GaussianDpEvent(1.0), 1))
    assert ExactGaussianAccountant().epsilon(runs, 1e-5) == gdp_epsilon(1e-5, 2**0.5)


def test_refusals_name_the_event_and_the_remedy() -> None:
    skellam = ((SkellamEvent(100.0, 10.0, 3.0, 0.1), 5),)
    own_pld = ((GaussianPldEvent(2.0), 3),)
    assert "use accountant='rdp'" in str(PldAccountant().refusal(skellam))
    assert "use accountant='pld'" in str(RdpAccountant().refusal(own_pld))
    assert ExactGaussianAccountant().refusal(((STEP, 1),)) is not None
    assert OwnAnalysis().refusal(((OwnOnlyEvent(0.5), 1), (STEP, 1))) is not None
    assert MonteCarloEstimate().refusal(((STEP, 1),)) is not None
    replace = PldAccountant(AccountingSettings(neighboring_relation="replace_one"))
    assert replace.refusal(((STEP, 1),)) is None
    assert "rdp accountant" in str(
        RdpAccountant(AccountingSettings(neighboring_relation="replace_one")).refusal(((STEP, 1),))
    )


def test_monte_carlo_estimate_behind_the_protocol() -> None:
    runs = ((RandomAllocationEvent(1.0, 4, 2), 1),)
    mc = MonteCarloEstimate()
    assert mc.refusal(runs) is None
    est = allocation_epsilon_estimate(list(runs), 1e-3)
    assert est is not None
    eps = mc.epsilon(runs, 1e-3)
    assert eps == est.epsilon
    assert mc.delta(runs, eps) == pytest.approx(1e-3, rel=1e-4)
