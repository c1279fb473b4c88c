"""PrivacyLedger contract: one test class run against every accountant configuration."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from fedpriv.accounting.core.event import FedprivEvent, event_from_dict, event_to_dict
from fedpriv.accounting.core.ledger import IncompatibleEventsError, PrivacyLedger
from fedpriv.accounting.dpsgd import poisson_gaussian_event
from fedpriv.common.errors import ConfigError

CONFIGS = [("pld", "default"), ("rdp", "default"), ("rdp", "mironov")]


@dataclasses.dataclass(frozen=True)
class PureDpEvent(FedprivEvent):
    """A test-only pure ε0-DP event that knows only its own (ε, δ): basic composition."""

    eps0: float
    tags: tuple[str, ...] = ()

    def epsilon(self, target_delta: float, count: int = 1) -> float:
        return count * self.eps0

    def delta(self, target_epsilon: float, count: int = 1) -> float:
        return 0.0 if target_epsilon >= count * self.eps0 else 1.0


@dataclasses.dataclass(frozen=True)
class ZcdpLikeEvent(FedprivEvent):
    """A test-only RDP event: ρ-zCDP, ε(α) = ρα (the Gaussian with σ = 1/√(2ρ))."""

    rho: float
    composes_by_rdp = True

    def rdp(self, orders: np.ndarray) -> np.ndarray:
        return self.rho * np.asarray(orders, dtype=float)


@pytest.mark.parametrize("accountant,conversion", CONFIGS)
class TestLedgerContract:
    def make(self, accountant: str, conversion: str) -> PrivacyLedger:
        return PrivacyLedger(accountant=accountant, conversion=conversion)

    def test_empty_is_zero(self, accountant, conversion):
        ledger = self.make(accountant, conversion)
        assert ledger.get_epsilon(1e-5) == 0.0
        assert ledger.get_delta(1.0) == 0.0

    def test_consecutive_equal_events_merge(self, accountant, conversion):
        ledger = self.make(accountant, conversion)
        a, b = poisson_gaussian_event(1.0, 0.01), poisson_gaussian_event(2.0, 0.01)
        ledger.record(a, 10)
        ledger.record(poisson_gaussian_event(1.0, 0.01), 5)
        ledger.record(b)
        ledger.record(a, 2)
        assert ledger.runs == ((a, 15), (b, 1), (a, 2))
        assert ledger.steps == 18

    def test_counts_equal_repeated_records(self, accountant, conversion):
        # Merged runs must give exactly the ε of one run with the total count.
        one, many = self.make(accountant, conversion), self.make(accountant, conversion)
        ev = poisson_gaussian_event(1.2, 0.02)
        one.record(ev, 300)
        for _ in range(3):
            many.record(ev, 100)
        assert one.get_epsilon(1e-5) == many.get_epsilon(1e-5)

    def test_json_round_trip_recomputes_identically(self, accountant, conversion):
        ledger = self.make(accountant, conversion)
        ledger.record(poisson_gaussian_event(1.1, 0.01), 1000)
        ledger.record(poisson_gaussian_event(0.9, 1.0), 3)
        ledger.record(poisson_gaussian_event(1.7, 0.05), 50)
        d = json.loads(json.dumps(ledger.to_dict()))
        again = PrivacyLedger.from_dict(d)
        assert again.runs == ledger.runs
        assert again.get_epsilon(1e-6) == ledger.get_epsilon(1e-6)
        assert again.get_delta(2.0) == ledger.get_delta(2.0)

    def test_matches_dp_accounting_directly(self, accountant, conversion):
        # Independent: dp-accounting's accountant fed the same (event, count) pairs.
        runs = [(poisson_gaussian_event(1.1, 0.01), 1000), (poisson_gaussian_event(2.0, 0.1), 200)]
        ledger = self.make(accountant, conversion)
        for e, c in runs:
            ledger.record(e, c)
        rdp = rdp_privacy_accountant.RdpAccountant(
            list(range(2, 256)) if conversion == "mironov" else None
        )
        for e, c in runs:
            rdp.compose(e, c)
        if conversion == "mironov":
            ref = float(np.min(rdp.rdp + math.log(1e5) / (rdp.orders - 1)))
        else:
            ref = rdp.get_epsilon(1e-5)
        dense = rdp_privacy_accountant.RdpAccountant(list(1 + np.geomspace(1e-3, 1e4, 400)))
        for e, c in runs:
            dense.compose(e, c)
        best = min(ref, dense.get_epsilon(1e-5))
        if accountant == "pld":
            pld = pld_privacy_accountant.PLDAccountant()
            for e, c in runs:
                pld.compose(e, c)
            ref, best = min(ref, pld.get_epsilon(1e-5)), min(best, pld.get_epsilon(1e-5))
        if conversion == "mironov":  # Mironov's published orders: the same grid exactly
            assert ledger.get_epsilon(1e-5) == pytest.approx(ref, rel=1e-12)
        else:  # never looser than dp-accounting's grid, within 1 % of its best over 400 orders
            assert ledger.get_epsilon(1e-5) <= ref * (1 + 1e-12)
            assert ledger.get_epsilon(1e-5) == pytest.approx(best, rel=0.01)

    def test_delta_inverts_epsilon(self, accountant, conversion):
        ledger = self.make(accountant, conversion)
        ledger.record(poisson_gaussian_event(1.0, 0.02), 500)
        eps = ledger.get_epsilon(1e-5)
        # δ(ε(δ)) ≤ δ up to the conversions' grid/order granularity (≤ 1 %).
        assert ledger.get_delta(eps) <= 1e-5 * 1.01
        assert ledger.get_delta(eps * 0.9) > 1e-5

    @pytest.mark.parametrize("bad", [0.0, 1.0, -1e-5, 2.0, float("nan")])
    def test_bad_delta_raises(self, accountant, conversion, bad):
        ledger = self.make(accountant, conversion)
        with pytest.raises(ConfigError, match="target_delta"):
            ledger.get_epsilon(bad)

    @pytest.mark.parametrize("count", [0, -3, 1.5, True])
    def test_bad_count_raises(self, accountant, conversion, count):
        with pytest.raises(ConfigError, match="count"):
            self.make(accountant, conversion).record(poisson_gaussian_event(1.0, 0.1), count)

    def test_standalone_event_alone_and_refused_in_company(self, accountant, conversion):
        ledger = self.make(accountant, conversion)
        ledger.record(PureDpEvent(0.5), 4)
        assert ledger.get_epsilon(1e-5) == 2.0
        with pytest.raises(IncompatibleEventsError, match="PureDpEvent"):
            ledger.record(poisson_gaussian_event(1.0, 0.1))
        with pytest.raises(IncompatibleEventsError):
            ledger.record(PureDpEvent(0.7))
        assert ledger.runs == ((PureDpEvent(0.5), 4),)  # nothing recorded on refusal
        other = self.make(accountant, conversion)
        other.record(poisson_gaussian_event(1.0, 0.1))
        with pytest.raises(IncompatibleEventsError):
            other.record(PureDpEvent(0.5))

    def test_rdp_event_composes_only_under_rdp(self, accountant, conversion):
        ledger = self.make(accountant, conversion)
        if accountant == "pld":
            with pytest.raises(IncompatibleEventsError, match="rdp"):
                ledger.record(ZcdpLikeEvent(0.5))
            return
        # ρ-zCDP with ρ = 1/(2σ²) is exactly the Gaussian's RDP curve: same ε at integer orders.
        sigma = 1.3
        ledger.record(ZcdpLikeEvent(1 / (2 * sigma**2)), 7)
        ledger.record(poisson_gaussian_event(sigma, 1.0), 3)
        ref = rdp_privacy_accountant.RdpAccountant(list(range(2, 256)))
        ref.compose(dp_event.GaussianDpEvent(sigma), 10)
        orders = ref.orders
        if conversion == "mironov":
            want = float(np.min(ref.rdp + math.log(1e5) / (orders - 1)))
        else:
            want = rdp_privacy_accountant.compute_epsilon(orders, ref.rdp, 1e-5)[0]
        assert ledger.get_epsilon(1e-5) == pytest.approx(want, rel=1e-9)

    def test_own_event_json_round_trip(self, accountant, conversion):
        ledger = self.make(accountant, conversion)
        ledger.record(PureDpEvent(0.25, ("a", "b")), 3)
        again = PrivacyLedger.from_dict(json.loads(json.dumps(ledger.to_dict())))
        assert again.runs == ledger.runs
        assert again.get_epsilon(1e-5) == 0.75


def test_mironov_needs_rdp_and_unknown_names_refused():
    with pytest.raises(ConfigError, match="conversion"):
        PrivacyLedger(accountant="pld", conversion="mironov")
    with pytest.raises(ConfigError, match="accountant"):
        PrivacyLedger(accountant="prv")
    with pytest.raises(ConfigError, match="neighboring_relation"):
        PrivacyLedger(neighboring_relation="swap")


def test_replace_one_refuses_poisson_under_rdp():
    # dp-accounting's RDP analysis of Poisson sampling is add/remove only: refused, not guessed.
    ledger = PrivacyLedger(accountant="rdp", neighboring_relation="replace_one")
    with pytest.raises(IncompatibleEventsError, match="replace_one"):
        ledger.record(poisson_gaussian_event(1.0, 0.1))


def test_event_from_dict_only_loads_event_classes():
    with pytest.raises(ConfigError):
        event_from_dict({"fedpriv_event": "os:system"})
    with pytest.raises(ConfigError):
        event_from_dict({"dp_event": "compute_epsilon"})
    nested = dp_event.ComposedDpEvent(
        [poisson_gaussian_event(1.0, 0.5), dp_event.GaussianDpEvent(2.0)]
    )
    assert event_from_dict(json.loads(json.dumps(event_to_dict(nested)))) == nested


def test_analysis_names_what_answers_for_epsilon():
    from fedpriv.accounting.batch_clipping.spec import BatchClippingEvent
    from fedpriv.accounting.loss_models.skellam_rdp import SkellamEvent

    assert PrivacyLedger().analysis() == "none"
    pg = poisson_gaussian_event(1.1, 0.01)
    led = PrivacyLedger()
    led.record(pg, 10)
    assert led.analysis() == "pld"
    led = PrivacyLedger(accountant="rdp", conversion="mironov")
    led.record(pg, 10)
    assert led.analysis() == "rdp (mironov)"
    led.record(SkellamEvent(mu=100.0, l1_sensitivity=10.0, l2_sensitivity=3.0, sample_rate=0.01), 5)
    assert led.analysis() == "rdp (mironov)"
    # a stand-alone event answers by its own analysis, whatever accountant was asked for
    bc = PrivacyLedger(accountant="rdp", conversion="mironov", neighboring_relation="replace_one")
    bc.record(BatchClippingEvent("shuffle", 600, 1, 100, 2.0), 6)
    assert bc.analysis() == "BatchClippingEvent (own analysis)"
