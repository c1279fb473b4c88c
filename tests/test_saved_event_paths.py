"""A ledger saved before the accounting package was grouped by concept (module paths such as
``fedpriv.accounting.allocation:RandomAllocationEvent``) still restores, to the same ε."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import fedpriv.accounting as accounting
from fedpriv.accounting.core.event import MOVED_EVENT_MODULES, FedprivEvent, event_from_dict


def _event_classes() -> dict[str, type[FedprivEvent]]:
    found: dict[str, type[FedprivEvent]] = {}
    for info in pkgutil.walk_packages(accounting.__path__, "fedpriv.accounting."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, FedprivEvent) and cls.__module__ == info.name:
                found[f"{cls.__module__}:{cls.__qualname__}"] = cls
    return found


def test_every_old_module_maps_to_an_existing_module() -> None:
    for old, new in MOVED_EVENT_MODULES.items():
        assert old.startswith("fedpriv.accounting.")
        importlib.import_module(new)  # raises if a target is wrong


@pytest.mark.parametrize(
    ("old_path", "new_path"),
    [
        ("fedpriv.accounting.ledger:PldEvent", "fedpriv.accounting.core.event:PldEvent"),
        (
            "fedpriv.accounting.allocation:RandomAllocationEvent",
            "fedpriv.accounting.samplers.random_allocation:RandomAllocationEvent",
        ),
        (
            "fedpriv.accounting.batch_clipping:BatchClippingEvent",
            "fedpriv.accounting.batch_clipping.spec:BatchClippingEvent",
        ),
        (
            "fedpriv.accounting.checkin_events:CheckinEvent",
            "fedpriv.accounting.checkin.events:CheckinEvent",
        ),
    ],
)
def test_an_old_event_path_restores_the_class_of_today(old_path: str, new_path: str) -> None:
    classes = _event_classes()
    assert new_path in classes, sorted(classes)
    module, _, name = old_path.partition(":")
    new_module = MOVED_EVENT_MODULES[module]
    assert getattr(importlib.import_module(new_module), name) is classes[new_path]


def test_a_saved_random_allocation_ledger_restores_to_the_same_epsilon() -> None:
    from fedpriv.accounting.core.ledger import PrivacyLedger
    from fedpriv.accounting.samplers.random_allocation import RandomAllocationEvent

    ledger = PrivacyLedger()
    ledger.record(RandomAllocationEvent(noise_multiplier=1.0, num_steps=4, num_selected=1), 2)
    saved = ledger.to_dict()
    for run in saved["runs"]:
        run["event"]["fedpriv_event"] = "fedpriv.accounting.allocation:RandomAllocationEvent"
    restored = PrivacyLedger.from_dict(saved)
    assert restored.get_epsilon(1e-5) == ledger.get_epsilon(1e-5)
    assert event_from_dict(saved["runs"][0]["event"]) == ledger.runs[0][0]
