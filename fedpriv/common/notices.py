"""Known, non-actionable notices of fedpriv's dependencies, kept off the per-round table.

Only these exact notices are dropped; every other warning of Flower and Ray still shows:

* Flower 1.42: "The `run_simulation` function is deprecated ... use `flwr run`": fedpriv pins
  ``flwr<1.43`` and drives the simulation engine in-process on purpose (Hydra sweeps, one
  process per run);
* Flower's actors at shutdown: "Manually terminating ClientAppActor" (the normal end of a run);
* Ray 2.55: the ``FutureWarning`` "Tip: In future versions of Ray, Ray will no longer override
  accelerator visible devices ...": fedpriv relies on today's behaviour (a client actor given
  no GPU sees none) and states its GPU use through ``client_resources``.
"""

from __future__ import annotations

import logging
import warnings

FLOWER_NOTICES = ("run_simulation` function is deprecated", "Manually terminating ClientAppActor")
RAY_TIP = r"Tip: In future versions of Ray, Ray will no longer override accelerator"


class _KnownNotices(logging.Filter):
    """Drops log records whose message contains one of :data:`FLOWER_NOTICES`."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(n in message for n in FLOWER_NOTICES)


def quiet_known_notices() -> None:
    """Install the filters (idempotent; call in the driver and in each Ray worker)."""
    flwr_logger = logging.getLogger("flwr")
    if not any(isinstance(f, _KnownNotices) for f in flwr_logger.filters):
        flwr_logger.addFilter(_KnownNotices())
    warnings.filterwarnings("ignore", message=RAY_TIP, category=FutureWarning)
