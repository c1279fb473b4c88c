"""Every accountant behind :class:`~fedpriv.accounting.core.accountant.EventAccountant`, by
name, and the ones a ledger's ``accountant`` setting chooses.

Each entry declares ``upper_bound``. A ledger (and so every budget, calibration and reported
ε) is answered only by upper bounds: :data:`BUDGET_ACCOUNTANTS` for the ``accountant``
setting, the exact μ-GDP answer for Gaussian releases without sampling, or a lone event's own
analysis. The Monte Carlo estimate of random allocation is listed here, behind the same
protocol, so that it is found and documented beside them; its ``upper_bound`` is ``False``
(a sample mean can fall below the true ε) and no ledger uses it: it is printed beside the
budget (``fedpriv-account ... lower_bound=true``), never as one.
"""

from __future__ import annotations

from collections.abc import Callable

from fedpriv.accounting.accountants.gdp import ExactGaussianAccountant
from fedpriv.accounting.accountants.monte_carlo import MonteCarloEstimate
from fedpriv.accounting.accountants.pld import PldAccountant
from fedpriv.accounting.accountants.rdp import RdpAccountant
from fedpriv.accounting.core.accountant import AccountingSettings, EventAccountant, OwnAnalysis
from fedpriv.accounting.core.vocabulary import Accountant

#: An accountant class: built from the ledger's settings.
Factory = Callable[[AccountingSettings], EventAccountant]

#: The accountant each value of the ledger's ``accountant`` setting names (both upper bounds).
BUDGET_ACCOUNTANTS: dict[Accountant, Factory] = {
    Accountant.PLD: PldAccountant,
    Accountant.RDP: RdpAccountant,
}

#: Every accountant, by name (``upper_bound`` says whether it may answer a budget).
REGISTRY: dict[str, Factory] = {
    "pld": PldAccountant,
    "rdp": RdpAccountant,
    "gaussian_exact": ExactGaussianAccountant,
    "own_analysis": OwnAnalysis,
    "monte_carlo": MonteCarloEstimate,
}
