"""Privacy loss distributions: the ledger's PLD accountant (``accountant="pld"``).

Two kinds of runs are accounted here:

* dp-accounting events, by dp-accounting's ``PLDAccountant`` on a loss grid chosen from the
  runs (:meth:`PldAccountant.interval`); the answer is ``min(PLD ε, RDP ε)``: both are valid
  upper bounds, and PLD alone returns ``inf`` at extreme δ (1e-18) because of its truncated
  tail mass;
* fedpriv events known by the dominating PLD of one occurrence
  (:class:`~fedpriv.accounting.core.event.PldEvent`: fixed-size cohorts, random allocation,
  check-in slots), self-composed and, for a class that sets ``composes_with_own_kind``,
  composed with each other on the coarser of their loss grids
  (:func:`~fedpriv.accounting.accountants.pld_grid.compose_on_common_grid`).

References
----------
Meiser, Mohammadi, "Tight on budget? Tight bounds for r-fold approximate differential privacy"
(CCS 2018); Sommer, Meiser, Mohammadi, "Privacy loss classes: The central limit theorem in
differential privacy" (PoPETs 2019), composition of PLDs by convolution; Doroshenko, Ghazi,
Kamath, Kumar, Manurangsi, "Connect the Dots: Tighter Discrete Approximations of Privacy Loss
Distributions" (PoPETs 2022), pessimistic discretization; Zhu, Dong, Wang, "Optimal Accounting
of Differential Privacy via Characteristic Function" (arXiv:2106.08567), Thm. 10, composition
of dominating pairs.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from dp_accounting.pld import pld_privacy_accountant

from fedpriv.accounting.accountants.pld_grid import compose_on_common_grid
from fedpriv.accounting.accountants.rdp import RdpAccountant, rdp_to_epsilon
from fedpriv.accounting.core.accountant import (
    RELATIONS,
    AccountingSettings,
    Runs,
    RunsMemo,
    own_events,
    unsupported_dp_event,
)

#: PLD grids (value discretization intervals) the automatic choice picks from.
PLD_GRIDS = (1e-4, 2e-4, 5e-4, 1e-3)
#: ε (RDP, at δ = 1e-5) up to which the finest grid is used; above it the grid grows with ε.
PLD_FINE_UP_TO = 5.0
#: Above this RDP ε (at δ = 1e-5) the PLD is skipped: RDP is a valid bound, and the PLD of such
#: a weak mechanism (tiny σ, ~1e8 steps) needs more memory than any machine has.
PLD_MAX_RDP_EPSILON = 1000.0


class PldAccountant:
    """Privacy loss distributions composed by convolution, with RDP as a second bound.

    dp-accounting events: each event's PLD is discretized pessimistically (connect-the-dots,
    Doroshenko et al. 2022), so the composed PLD dominates the composed mechanism (Meiser,
    Mohammadi 2018; Sommer et al. 2019) and its ε is an upper bound at any grid; the RDP ε of
    the same runs (:class:`~fedpriv.accounting.accountants.rdp.RdpAccountant`, with the
    settings' conversion) is another, and the smaller is reported. The PLD is skipped above
    :data:`PLD_MAX_RDP_EPSILON`.

    fedpriv PLD events: ``count`` occurrences are the dominating PLD self-composed; events of
    one class that ``composes_with_own_kind`` compose on the coarser loss grid, each loss
    rounded up (still dominating). The composition of dominating pairs dominates the composed
    mechanism (Zhu, Dong, Wang, arXiv:2106.08567, Thm. 10).

    Parameters
    ----------
    settings : AccountingSettings
        The neighbouring relation, the PLD grid (``None``: :meth:`interval`) and the conversion
        of the RDP bound.
    """

    upper_bound: ClassVar[bool] = True

    def __init__(self, settings: AccountingSettings | None = None) -> None:
        self.settings = settings or AccountingSettings()
        self.rdp = RdpAccountant(self.settings)
        self._memo = RunsMemo()

    def refusal(self, runs: Runs) -> str | None:
        """``None`` when PLD covers ``runs``: only fedpriv PLD events of one class (their kinds
        checked by the ledger), or dp-accounting events it supports."""
        own = own_events(runs)
        if any(e.composes_by_pld for e in own):
            return None
        relation = RELATIONS[self.settings.neighboring_relation]
        supports = pld_privacy_accountant.PLDAccountant(relation).supports
        reason = unsupported_dp_event(runs, supports, "pld", self.settings.neighboring_relation)
        if reason is None and own:
            return f"{type(own[0]).__name__} is accounted by RDP only; use accountant='rdp'"
        return reason

    def interval(self, runs: Runs) -> float:
        """The PLD discretization interval for dp-accounting events: the settings' one, else
        1e-4 (dp-accounting's default) while the RDP ε at δ = 1e-5 is ≤
        :data:`PLD_FINE_UP_TO`, growing in proportion to that ε up to 1e-3 beyond (a relative
        precision of about 1e-3 of ε at a flat cost)."""
        if self.settings.pld_discretization is not None:
            return self.settings.pld_discretization
        if not runs or not self.rdp.covers(runs):
            return PLD_GRIDS[0]
        scale = self._reference_epsilon(runs) / PLD_FINE_UP_TO
        for grid in PLD_GRIDS:
            if grid >= PLD_GRIDS[0] * scale:
                return grid
        return PLD_GRIDS[-1]

    def _reference_epsilon(self, runs: Runs) -> float:
        """RDP ε at δ = 1e-5 on the fixed grid (dp-accounting's conversion): sizes the PLD."""
        orders, rdp = self.rdp.curve(runs)
        return rdp_to_epsilon(orders, rdp, 1e-5, "default")

    def _feasible(self, runs: Runs) -> bool:
        """Whether to build the PLD: not when the RDP bound is already beyond any use."""
        if not self.rdp.covers(runs):
            return True
        return self._reference_epsilon(runs) <= PLD_MAX_RDP_EPSILON

    def _own_pld(self, runs: Runs) -> Any:
        """The fedpriv events' PLDs self-composed and composed on common grids (cached)."""

        def compute() -> Any:
            event, count = runs[0]
            pld = event.pld().self_compose(count)
            for e, c in runs[1:]:
                pld = compose_on_common_grid(pld, e.pld().self_compose(c))
            return pld

        return self._memo.get(runs, "own", compute)

    def _dp_pld(self, runs: Runs) -> Any:
        """dp-accounting's PLD accountant with every run composed (cached)."""

        def compute() -> Any:
            relation = RELATIONS[self.settings.neighboring_relation]
            acc = pld_privacy_accountant.PLDAccountant(relation, self.interval(runs))
            for e, c in runs:
                acc.compose(e, c)
            return acc

        return self._memo.get(runs, "dp", compute)

    def epsilon(self, runs: Runs, target_delta: float) -> float:
        """ε of all runs at ``target_delta`` (>= 0)."""
        if own_events(runs):
            return max(float(self._own_pld(runs).get_epsilon_for_delta(target_delta)), 0.0)
        eps = math.inf
        if self._feasible(runs):
            eps = float(self._dp_pld(runs).get_epsilon(target_delta))
        if self.rdp.covers(runs):
            eps = min(eps, self.rdp.bound_epsilon(runs, target_delta))
        return max(eps, 0.0)

    def delta(self, runs: Runs, target_epsilon: float) -> float:
        """δ of all runs at ``target_epsilon`` (in [0, 1])."""
        if own_events(runs):
            delta = float(self._own_pld(runs).get_delta_for_epsilon(target_epsilon))
            return min(max(delta, 0.0), 1.0)
        delta = 1.0
        if self._feasible(runs):
            delta = float(self._dp_pld(runs).get_delta(target_epsilon))
        if self.rdp.covers(runs):
            delta = min(delta, self.rdp.bound_delta(runs, target_epsilon))
        return min(max(delta, 0.0), 1.0)

    def analysis(self, runs: Runs) -> str:
        """``"pld"``."""
        return "pld"
