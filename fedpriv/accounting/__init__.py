"""Privacy accounting: events, the run's ledger, calibration and every analysis of the papers.

Mechanisms produce events (dp-accounting ``DpEvent``s, or fedpriv's own
:class:`~fedpriv.accounting.ledger.FedprivEvent` dataclasses); a
:class:`~fedpriv.accounting.ledger.PrivacyLedger` keeps them as ``(event, count)`` runs and
recomputes ε from them. See ``docs/accounting.md`` and the ``fedpriv-account`` CLI.
"""

from fedpriv.accounting.calibrate import bisect_noise, calibrate_noise_multiplier
from fedpriv.accounting.dpsgd import DPSGDSpec, poisson_gaussian_epsilon, poisson_gaussian_event
from fedpriv.accounting.ledger import FedprivEvent, IncompatibleEventsError, PrivacyLedger
from fedpriv.accounting.secagg import secagg_dpsgd
from fedpriv.accounting.skellam import SkellamEvent, SkellamSpec

__all__ = [
    "DPSGDSpec",
    "FedprivEvent",
    "IncompatibleEventsError",
    "PrivacyLedger",
    "SkellamEvent",
    "SkellamSpec",
    "bisect_noise",
    "calibrate_noise_multiplier",
    "poisson_gaussian_epsilon",
    "poisson_gaussian_event",
    "secagg_dpsgd",
]


def _quiet_rdp_order_warnings() -> None:
    """dp-accounting logs a warning each time a fractional RDP order fails to converge and is
    excluded; excluding it is correct (the bound uses the other orders), so it is not shown."""
    import logging

    class _Filter(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return "failed to converge" not in record.getMessage()

    logging.getLogger("absl").addFilter(_Filter())


_quiet_rdp_order_warnings()
