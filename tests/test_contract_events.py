"""Every privacy event type the ledger accepts, through :class:`tests.contracts.EventContract`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from fedpriv.accounting.accountants.rdp import INTEGER_ORDERS
from fedpriv.accounting.batch_clipping.spec import BatchClippingEvent
from fedpriv.accounting.checkin.events import CheckinEvent, LocalCapEvent, PoissonLocalEvent
from fedpriv.accounting.dpsgd import poisson_gaussian_event
from fedpriv.accounting.loss_models.discrete_gaussian import DiscreteGaussianEvent
from fedpriv.accounting.loss_models.local_randomizer import LocalReleaseEvent
from fedpriv.accounting.loss_models.skellam_rdp import SkellamEvent
from fedpriv.accounting.samplers.fixed_size import WithoutReplacementGaussianEvent
from fedpriv.accounting.samplers.random_allocation import RandomAllocationEvent
from tests.contracts import EventContract, gaussian_epsilon

DELTA = 1e-5


def _pld(event: Any, count: int, delta: float = DELTA) -> float:
    """dp-accounting's own PLD accountant, composed directly (add/remove)."""
    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(event, count)
    return float(acc.get_epsilon(delta))


class TestPoissonGaussianEvent(EventContract):
    """fedpriv's DP-SGD step (q < 1) under dp-accounting's PLD accountant."""

    event_class = dp_event.PoissonSampledDpEvent

    noise_levels = (1.0, 2.0, 4.0)
    unsupported_accountant = None
    incompatible = True

    def make_event(self, noise: float) -> Any:
        return poisson_gaussian_event(noise, 0.05)

    def incompatible_partner(self) -> Any:
        # standalone (own analysis only) and valid under add/remove: composes with nothing
        return LocalReleaseEvent("gaussian", 1.0)

    def golden(self) -> list[tuple[Any, int, float, float]]:
        # dp-accounting's PLD accountant, same grid 1e-4 (the ledger's choice below ε = 5);
        # the ledger may only be lower when its RDP bound is lower: rel 1e-3
        return [
            (self.make_event(s), c, _pld(self.make_event(s), c), 1e-3)
            for s in (1.0, 3.0)
            for c in (1, 10)
        ]


class TestPoissonGaussianEventRdp(TestPoissonGaussianEvent):
    """The same event under RDP (dp-accounting's RDP accountant) and Mironov's conversion."""

    accountant = "rdp"
    conversion = "mironov"
    unsupported_relation = "replace_one"  # dp-accounting's RDP: Poisson sampling is add/remove

    def test_composes_with_skellam_by_rdp(self) -> None:
        """Rule 2 of the ledger: RDP curves add up (checked against the sum of the parts)."""
        gauss = self.make_event(1.0)
        sk = SkellamEvent(mu=1e6, l1_sensitivity=3000.0, l2_sensitivity=100.0)
        ledger = self.ledger()
        ledger.record(gauss, 3)
        ledger.record(sk, 2)
        orders = np.arange(2, 256, dtype=float)
        acc = rdp_privacy_accountant.RdpAccountant(list(orders))
        acc.compose(gauss, 3)
        rdp = acc._rdp + 2 * sk.rdp(orders)  # noqa: SLF001
        eps = float(np.min(rdp + math.log(1 / DELTA) / (orders - 1)))
        assert ledger.get_epsilon(DELTA) == pytest.approx(eps, rel=1e-9)

    def golden(self) -> list[tuple[Any, int, float, float]]:
        out = []
        for sigma in (1.0, 3.0):
            acc = rdp_privacy_accountant.RdpAccountant(list(np.arange(2, 256, dtype=float)))
            acc.compose(self.make_event(sigma), 10)
            # Mironov 2017 Prop. 3 on dp-accounting's RDP curve, orders 2..255
            eps = float(np.min(acc._rdp + math.log(1 / DELTA) / (acc._orders - 1)))  # noqa: SLF001
            out.append((self.make_event(sigma), 10, eps, 1e-9))
        return out


class TestGaussianEvent(EventContract):
    """q = 1: the plain Gaussian mechanism; golden: the exact Gaussian ε (Balle & Wang 2018)."""

    event_class = dp_event.GaussianDpEvent

    noise_levels = (0.5, 1.0, 2.0, 4.0)

    def make_event(self, noise: float) -> Any:
        return poisson_gaussian_event(noise, 1.0)

    def incompatible_partner(self) -> Any:
        return BatchClippingEvent("shuffle", 100, 1, 10, 1.0)

    def golden(self) -> list[tuple[Any, int, float, float]]:
        # PLD is pessimistic (upper bound) and tight to ~1e-3 of ε at grid 1e-4
        return [
            (self.make_event(s), c, gaussian_epsilon(DELTA, math.sqrt(c) / s), 2e-3)
            for s in (1.0, 4.0)
            for c in (1, 10)
        ]

    def test_never_below_the_exact_gaussian_epsilon(self) -> None:
        for s in self.noise_levels:
            for c in self.counts:
                exact = gaussian_epsilon(DELTA, math.sqrt(c) / s)
                assert self.epsilon(self.make_event(s), c) >= exact * (1 - 1e-9), (s, c)


class TestSkellamEvent(EventContract):
    """The (Poisson-subsampled) Skellam release, RDP only."""

    event_class = SkellamEvent

    noise_levels = (50.0, 200.0, 1000.0, 5000.0)  # μ, with Δ1 = Δ2² = 100 (Δ2 = 10)
    accountant = "rdp"
    unsupported_relation = "replace_one"
    unsupported_accountant = "pld"

    def make_event(self, noise: float) -> Any:
        return SkellamEvent(mu=noise, l1_sensitivity=100.0, l2_sensitivity=10.0, sample_rate=0.1)

    def incompatible_partner(self) -> Any:
        return BatchClippingEvent("shuffle", 100, 1, 10, 1.0)

    def golden(self) -> list[tuple[Any, int, float, float]]:
        out = []
        for mu, d1, d2 in ((200.0, 100.0, 10.0), (1e6, 3000.0, 100.0)):
            # AKL21 Thm 3.5, written out here, converted by dp-accounting: exact to 1e-9
            a = INTEGER_ORDERS
            rdp = a * d2**2 / (4 * mu) + np.minimum(
                ((2 * a - 1) * d2**2 + 6 * d1) / (16 * mu**2), 3 * d1 / (4 * mu)
            )
            eps = rdp_privacy_accountant.compute_epsilon(a, 7 * rdp, DELTA)[0]
            out.append((SkellamEvent(mu=mu, l1_sensitivity=d1, l2_sensitivity=d2), 7, eps, 1e-9))
        # large μ: within 1% of the Gaussian of the same variance (RDP, dp-accounting)
        mu, d2 = 1e6, 100.0
        acc = rdp_privacy_accountant.RdpAccountant(list(INTEGER_ORDERS))
        acc.compose(dp_event.GaussianDpEvent(math.sqrt(2 * mu) / d2), 7)
        gauss = acc.get_epsilon(DELTA)
        out.append((SkellamEvent(mu=mu, l1_sensitivity=3000.0, l2_sensitivity=d2), 7, gauss, 1e-2))
        return out


class TestBatchClippingEvent(EventContract):
    """Algorithm 1 of the batch-clipping paper (f-DP mixture), replace-one, standalone."""

    event_class = BatchClippingEvent

    noise_levels = (1.0, 2.0, 4.0, 8.0)
    counts = (1, 4, 10)
    relation = "replace_one"
    unsupported_relation = "add_remove"

    def make_event(self, noise: float) -> Any:
        return BatchClippingEvent("shuffle", 40, 2, 5, noise)

    def incompatible_partner(self) -> Any:
        return poisson_gaussian_event(1.0, 1.0)

    def golden(self) -> list[tuple[Any, int, float, float]]:
        # m = 1 group of s = N records: every round clips the whole data as one group, so
        # each round is the Gaussian mechanism with sensitivity 2C and noise 2Cσ (μ = 1/σ);
        # c rounds: sqrt(c)/σ-GDP exactly (Dong, Roth, Su 2019, Cor. 3.3)
        return [
            (
                BatchClippingEvent("shuffle", 10, 1, 10, s),
                c,
                gaussian_epsilon(DELTA, c**0.5 / s),
                1e-6,
            )
            for s in (1.0, 4.0)
            for c in (1, 9)
        ]


class TestBatchClippingSubsampleEvent(TestBatchClippingEvent):
    def make_event(self, noise: float) -> Any:
        return BatchClippingEvent("subsample", 40, 4, 1, noise)

    def golden(self) -> list[tuple[Any, int, float, float]]:
        return [
            (
                BatchClippingEvent("subsample", 10, 1, 10, s),
                c,
                gaussian_epsilon(DELTA, c**0.5 / s),
                1e-6,
            )
            for s in (1.0, 4.0)
            for c in (1, 9)
        ]


class TestCheckinEvent(EventContract):
    """One pass of random check-ins (fixed window, Thm 3.2), standalone, replace-one."""

    event_class = CheckinEvent

    noise_levels = (1 / 2.0, 1 / 1.0, 1 / 0.5, 1 / 0.1)  # noise = 1/ε0
    counts = (1, 2, 5)
    relation = "replace_one"
    target_delta = 1e-6
    unsupported_relation = "add_remove"

    def make_event(self, noise: float) -> Any:
        return CheckinEvent("fixed", 1.0 / noise, 1000, 100)

    def incompatible_partner(self) -> Any:
        return poisson_gaussian_event(1.0, 1.0)

    def test_never_above_basic_composition(self) -> None:
        """Every client sends one ε0-DP report per pass: count·ε0 always holds."""
        for noise in self.noise_levels:
            for c in self.counts:
                assert self.epsilon(self.make_event(noise), c) <= c / noise + 1e-12


class TestCheckinAveragedEvent(TestCheckinEvent):
    def make_event(self, noise: float) -> Any:
        return CheckinEvent("averaged", 1.0 / noise, 1000, 100)


class TestLocalReleaseEvent(EventContract):
    """A check-in client's own Gaussian release (its LDP): exactly the Gaussian mechanism."""

    event_class = LocalReleaseEvent

    noise_levels = (1.0, 2.0, 4.0)
    relation = "replace_one"

    def make_event(self, noise: float) -> Any:
        return LocalReleaseEvent("gaussian", noise)

    def incompatible_partner(self) -> Any:
        return poisson_gaussian_event(1.0, 1.0)

    def golden(self) -> list[tuple[Any, int, float, float]]:
        return [
            (self.make_event(s), c, gaussian_epsilon(self.target_delta, math.sqrt(c) / s), 2e-3)
            for s in (1.0, 4.0)
            for c in (1, 10)
        ]


class TestPoissonLocalEvent(EventContract):
    """The server-sampled baseline of the check-in paper (mixture over participations)."""

    event_class = PoissonLocalEvent

    noise_levels = (0.5, 1.0, 2.0, 4.0)  # σ/(2L) of a Gaussian randomizer: μ = 1/noise
    counts = (1, 2, 5)
    relation = "replace_one"
    unsupported_relation = "add_remove"
    target_delta = 1e-6

    def make_event(self, noise: float) -> Any:
        return PoissonLocalEvent(local_epsilon=2.0, slot_sample_rate=0.1, steps=10, mu=1.0 / noise)

    def incompatible_partner(self) -> Any:
        return poisson_gaussian_event(1.0, 1.0)

    def golden(self) -> list[tuple[Any, int, float, float]]:
        # q = 1: the client reports at every one of the count·steps steps, so the release is
        # exactly sqrt(count·steps)·μ-GDP (the Binomial mixture has one component)
        out = []
        for noise in (1.0, 4.0):
            e = PoissonLocalEvent(local_epsilon=2.0, slot_sample_rate=1.0, steps=10, mu=1.0 / noise)
            mu = math.sqrt(2 * 10) / noise
            out.append((e, 2, gaussian_epsilon(self.target_delta, mu), 1e-3))
        return out


class TestLocalCapEvent(EventContract):
    """A check-in pass accounted by the local cap alone (the (ε0, δ0) precondition of the
    theorems fails): every client sends one (ε0, δ0)-DP report per pass, so ``count`` passes
    are (count ε0, count δ0)-DP by basic composition; replace-one, standalone."""

    event_class = LocalCapEvent

    noise_levels = (1 / 4.0, 1 / 2.0, 1 / 1.0, 1 / 0.5)  # noise = 1/ε0
    relation = "replace_one"
    unsupported_relation = "add_remove"
    target_delta = 1e-6

    def make_event(self, noise: float) -> Any:
        return LocalCapEvent(1.0 / noise, 1e-9, reason="precondition fails (test)")

    def incompatible_partner(self) -> Any:
        return poisson_gaussian_event(1.0, 1.0)

    def golden(self) -> list[tuple[Any, int, float, float]]:
        # basic composition, exactly: count x eps0 (while count x delta0 <= target_delta)
        return [
            (LocalCapEvent(e0, d0, reason="test"), c, c * e0, 1e-15)
            for e0, d0 in ((2.0, 1e-9), (0.5, 0.0))
            for c in (1, 7)
        ]

    def test_delta_is_the_composed_local_delta(self) -> None:
        """δ(ε) = count δ0 at ε >= count ε0, else 1 (nothing better is claimed)."""
        ev = LocalCapEvent(2.0, 1e-9, reason="test")
        assert ev.delta(6.0, 3) == pytest.approx(3e-9, rel=1e-15)
        assert ev.delta(5.9, 3) == 1.0

    def test_no_bound_when_the_local_deltas_exceed_the_target(self) -> None:
        """``count δ0 > target_delta``: no ε holds; the event raises (never a number) and
        its bound says why."""
        ev = LocalCapEvent(2.0, 1e-7, reason="precondition fails (test)")
        with pytest.raises(NotImplementedError, match="repetitions x local_delta"):
            ev.epsilon(1e-6, 20)
        b = ev.bound(1e-6, 20)
        assert b.epsilon == math.inf and b.reason and "precondition fails" in b.reason


class TestDiscreteGaussianEvent(EventContract):
    """secure_mode's lattice discrete Gaussian (Poisson-subsampled), RDP only: its curve is the
    continuous Gaussian's (Canonne, Kamath, Steinke 2020, Thm 15)."""

    event_class = DiscreteGaussianEvent

    noise_levels = (0.5, 1.0, 2.0, 4.0)
    accountant = "rdp"
    unsupported_relation = "replace_one"
    unsupported_accountant = "pld"

    def make_event(self, noise: float) -> Any:
        return DiscreteGaussianEvent(noise, 0.05)

    def incompatible_partner(self) -> Any:
        return BatchClippingEvent("shuffle", 100, 1, 10, 1.0)

    def golden(self) -> list[tuple[Any, int, float, float]]:
        # q = 1: α/(2z²) written out, converted by dp-accounting; q < 1: dp-accounting's RDP of
        # the Poisson-subsampled continuous Gaussian at the same integer orders (1e-9)
        a = INTEGER_ORDERS
        out = []
        for z, c in ((1.0, 1), (2.0, 10)):
            eps = rdp_privacy_accountant.compute_epsilon(a, c * a / (2 * z * z), DELTA)[0]
            out.append((DiscreteGaussianEvent(z), c, eps, 1e-9))
        acc = rdp_privacy_accountant.RdpAccountant(list(a))
        acc.compose(dp_event.PoissonSampledDpEvent(0.05, dp_event.GaussianDpEvent(1.0)), 50)
        out.append((DiscreteGaussianEvent(1.0, 0.05), 50, acc.get_epsilon(DELTA), 1e-9))
        return out


class TestRandomAllocationEvent(EventContract):
    """Random allocation (k of every t rounds, one event per epoch): pld-accounting's
    dominating PLD, self-composed over epochs, PLD only."""

    event_class = RandomAllocationEvent

    noise_levels = (0.7, 1.0, 2.0)
    counts = (1, 2, 5)
    unsupported_relation = "replace_one"
    unsupported_accountant = "rdp"
    monotone_rtol = 1e-9

    def make_event(self, noise: float) -> Any:
        return RandomAllocationEvent(noise, 4, 1)

    def incompatible_partner(self) -> Any:
        return poisson_gaussian_event(1.0, 1.0)

    def golden(self) -> list[tuple[Any, int, float, float]]:
        # t = k = 1: every client in the epoch's only round, the Gaussian mechanism: the exact
        # Gaussian ε (Balle & Wang 2018) of c epochs, sqrt(c)/σ-GDP (PLD grid: 1 %)
        return [
            (RandomAllocationEvent(s, 1, 1), c, gaussian_epsilon(DELTA, math.sqrt(c) / s), 1e-2)
            for s in (1.0, 2.0)
            for c in (1, 4)
        ]

    def test_between_pld_accountings_own_bounds(self) -> None:
        """t = 4, k = 1, σ = 1, 3 epochs: within pld-accounting's lower and upper bounds
        (``gaussian_allocation_epsilon_range``; 2 % slack for the grids)."""
        import PLD_accounting as pa

        upper, lower = pa.gaussian_allocation_epsilon_range(
            delta=DELTA, sigma=1.0, num_steps=4, num_selected=1, num_epochs=3
        )
        assert lower <= self.epsilon(self.make_event(1.0), 3) <= upper * 1.02


class TestWithoutReplacementGaussianEvent(EventContract):
    """Fixed-size cohorts (m of N without replacement), replace-one: the dominating pair's PLD
    (:mod:`fedpriv.accounting.samplers.fixed_size`), PLD only."""

    event_class = WithoutReplacementGaussianEvent

    noise_levels = (0.7, 1.0, 2.0)
    counts = (1, 3, 10)
    relation = "replace_one"
    unsupported_relation = "add_remove"
    unsupported_accountant = "rdp"
    monotone_rtol = 1e-9

    def make_event(self, noise: float) -> Any:
        return WithoutReplacementGaussianEvent(noise, 20, 1000)

    def incompatible_partner(self) -> Any:
        return dp_event.GaussianDpEvent(1.0)

    def golden(self) -> list[tuple[Any, int, float, float]]:
        # m = N: every client every round, a replaced client moves the sum by 2C: the exact
        # Gaussian ε of c rounds, 2 sqrt(c)/z-GDP (PLD grid 1e-3: 1 %)
        return [
            (
                WithoutReplacementGaussianEvent(z, 50, 50),
                c,
                gaussian_epsilon(DELTA, 2 * c**0.5 / z),
                1e-2,
            )
            for z in (2.0, 4.0)
            for c in (1, 4)
        ]
