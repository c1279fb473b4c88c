"""Only the known, non-actionable Flower/Ray notices are dropped; other warnings still show."""

from __future__ import annotations

import logging
import warnings

import pytest

from fedpriv.common.notices import RAY_TIP, quiet_known_notices


def test_known_flower_notices_dropped_others_kept(caplog: pytest.LogCaptureFixture) -> None:
    quiet_known_notices()
    quiet_known_notices()  # idempotent: one filter
    log = logging.getLogger("flwr")
    assert sum(type(f).__name__ == "_KnownNotices" for f in log.filters) == 1
    with caplog.at_level(logging.WARNING, logger="flwr"):
        log.warning(
            "DEPRECATED FEATURE: The `run_simulation` function is deprecated and will be removed"
        )
        log.warning("Manually terminating %s", "ClientAppActor")
        log.warning("Client 3 failed: out of memory")
    assert [r.getMessage() for r in caplog.records] == ["Client 3 failed: out of memory"]


def test_ray_tip_silenced_other_future_warnings_kept() -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_known_notices()
        warnings.warn(
            RAY_TIP + " visible devices env var if num_gpus=0", FutureWarning, stacklevel=1
        )
        warnings.warn("something else will change", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["something else will change"]
