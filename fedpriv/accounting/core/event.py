"""What an event is: fedpriv's own event kinds and the JSON form of every event.

A ledger (:mod:`fedpriv.accounting.core.ledger`) records two kinds of events:

* a dp-accounting :class:`~dp_accounting.dp_event.DpEvent` (Gaussian, Poisson-sampled
  Gaussian, ...). These compose with each other under both accountants.
* a fedpriv event: a small frozen dataclass deriving from :class:`FedprivEvent`, for analyses
  dp-accounting lacks (Skellam, f-DP mixtures, random check-ins). The protocol is:

  ``epsilon(target_delta, count=1) -> float`` and ``delta(target_epsilon, count=1) -> float``
      (required) the event's own (ε, δ) guarantee after ``count`` repetitions. Raise
      ``NotImplementedError`` with the reason when ``count`` repetitions are not covered.
  ``rdp(orders) -> np.ndarray`` (optional)
      RDP ε(α) of ONE occurrence at the given integer orders (shape of ``orders``). An event
      class that implements it sets ``composes_by_rdp = True`` (:class:`IntegerRdpEvent`); it
      then composes with dp-accounting events and other such events under
      ``accountant="rdp"``.
  ``pld()`` (optional)
      The dominating dp-accounting PLD of ONE occurrence; a class that implements it sets
      ``composes_by_pld = True`` (:class:`PldEvent`) and is self-composed by PLD under
      ``accountant="pld"``; with ``composes_with_own_kind`` it also composes with other events
      of its class.
  ``supported_relations`` (class attribute)
      The neighbouring relations its guarantee holds for (default ``{"add_remove"}``).

  JSON: :meth:`FedprivEvent.to_dict` / :meth:`FedprivEvent.from_dict` use the dataclass
  fields (tuples come back as tuples), so fields must be numbers, strings, bools or tuples of
  them. Override both for anything else. :func:`event_to_dict` / :func:`event_from_dict` write
  and read either kind, naming the class (``fedpriv_event: "module:Class"`` or
  ``dp_event: "Class"``).

Which accountant composes which events is the ledger's and the accountants' business
(:mod:`fedpriv.accounting.core.accountant`).
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from typing import Any, ClassVar

import attr
import numpy as np
from dp_accounting import dp_event

from fedpriv.accounting.accountants.rdp import (
    INTEGER_ORDERS,
    MIRONOV_ORDERS,
    rdp_to_delta,
    rdp_to_epsilon,
)
from fedpriv.common.errors import ConfigError


class FedprivEvent:
    """Base class of fedpriv's own events (frozen dataclasses). See the module docstring."""

    composes_by_rdp: ClassVar[bool] = False
    composes_by_pld: ClassVar[bool] = False
    composes_with_own_kind: ClassVar[bool] = False
    supported_relations: ClassVar[frozenset[str]] = frozenset({"add_remove"})

    def epsilon(self, target_delta: float, count: int = 1) -> float:
        """ε after ``count`` occurrences at ``target_delta``."""
        raise NotImplementedError

    def delta(self, target_epsilon: float, count: int = 1) -> float:
        """δ after ``count`` occurrences at ``target_epsilon``."""
        raise NotImplementedError

    def pld(self) -> Any:
        """Dominating dp-accounting PLD of one occurrence (only if ``composes_by_pld``)."""
        raise NotImplementedError(f"{type(self).__name__} has no PLD")

    def rdp(self, orders: np.ndarray) -> np.ndarray:
        """RDP ε(α) of one occurrence at ``orders`` (only if ``composes_by_rdp``)."""
        raise NotImplementedError(f"{type(self).__name__} has no RDP curve")

    def to_dict(self) -> dict[str, Any]:
        """The dataclass fields as a JSON-able dict."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FedprivEvent:
        """Inverse of :meth:`to_dict` (lists become tuples)."""
        return cls(**{k: _tuples(v) for k, v in d.items()})


class PldEvent(FedprivEvent):
    """A fedpriv event known by the dominating PLD of one occurrence (subclasses implement
    :meth:`pld`); ``count`` occurrences are its PLD self-composed: the composition of
    dominating pairs dominates the composed mechanism (Zhu, Dong, Wang, "Optimal Accounting of
    Differential Privacy via Characteristic Function", arXiv:2106.08567, Thm. 10)."""

    composes_by_pld: ClassVar[bool] = True

    def epsilon(self, target_delta: float, count: int = 1) -> float:
        if count == 0:
            return 0.0
        return float(self.pld().self_compose(count).get_epsilon_for_delta(target_delta))

    def delta(self, target_epsilon: float, count: int = 1) -> float:
        if count == 0:
            return 0.0
        return float(self.pld().self_compose(count).get_delta_for_epsilon(target_epsilon))


class IntegerRdpEvent(FedprivEvent):
    """A fedpriv event known by its RDP curve at integer orders (subclasses implement
    :meth:`rdp`); ``count`` occurrences are the curve times ``count`` (Mironov,
    arXiv:1702.07476, Prop. 1), converted at
    :data:`~fedpriv.accounting.accountants.rdp.INTEGER_ORDERS`
    (:data:`~fedpriv.accounting.accountants.rdp.MIRONOV_ORDERS` for Mironov's conversion) by
    :func:`~fedpriv.accounting.accountants.rdp.rdp_to_epsilon`."""

    composes_by_rdp: ClassVar[bool] = True

    def epsilon(self, target_delta: float, count: int = 1, conversion: str = "default") -> float:
        """ε of ``count`` occurrences at ``target_delta`` (integer orders)."""
        orders = MIRONOV_ORDERS if conversion == "mironov" else INTEGER_ORDERS
        return max(0.0, rdp_to_epsilon(orders, count * self.rdp(orders), target_delta, conversion))

    def delta(self, target_epsilon: float, count: int = 1, conversion: str = "default") -> float:
        """δ of ``count`` occurrences at ``target_epsilon`` (integer orders)."""
        orders = MIRONOV_ORDERS if conversion == "mironov" else INTEGER_ORDERS
        return rdp_to_delta(orders, count * self.rdp(orders), target_epsilon, conversion)


def event_to_dict(event: Any) -> dict[str, Any]:
    """JSON-able form of a dp-accounting event or a :class:`FedprivEvent`."""
    if isinstance(event, FedprivEvent):
        cls = type(event)
        return {"fedpriv_event": f"{cls.__module__}:{cls.__qualname__}", **event.to_dict()}
    if isinstance(event, dp_event.DpEvent):
        fields = {
            a.name: _dp_value_to_json(getattr(event, a.name)) for a in attr.fields(type(event))
        }
        return {"dp_event": type(event).__name__, **fields}
    raise ConfigError("event", event, "must be a dp_accounting DpEvent or a FedprivEvent")


#: Modules that held event classes before the accounting package was grouped by concept (a
#: saved ledger or checkpoint names its events by module): old -> new, under fedpriv.accounting.
MOVED_EVENT_MODULES: dict[str, str] = {
    f"fedpriv.accounting.{old}": f"fedpriv.accounting.{new}"
    for old, new in {
        "vocabulary": "core.vocabulary",
        "params": "core.params",
        "accountant": "core.accounting_spec",
        "ledger": "core.event",
        "calibrate": "core.calibrate",
        "privacy_spec": "core.privacy_spec",
        "lower_report": "core.lower_report",
        "lower_bound": "core.lower_bound",
        "group_privacy": "core.group_privacy",
        "pld_grid": "accountants.pld_grid",
        "rdp_orders": "accountants.rdp",
        "gdp": "accountants.gdp",
        "monte_carlo": "accountants.monte_carlo",
        "checkin_composition": "accountants.composition",
        "discrete_gaussian": "loss_models.discrete_gaussian",
        "local_release": "loss_models.local_randomizer",
        "without_replacement": "samplers.fixed_size",
        "allocation": "samplers.random_allocation",
        "shuffle": "samplers.shuffle",
        "checkin_theorems": "samplers.checkin",
        "batch_clipping": "batch_clipping.spec",
        "batch_clipping_lower": "batch_clipping.lower",
        "checkin_spec": "checkin.spec",
        "checkin_events": "checkin.events",
        "checkin_gaussian": "checkin.gaussian",
        "checkin_lower": "checkin.lower",
        "client_level": "client_level.spec",
        "client_skellam": "client_level.skellam_shares",
        "ftrl": "ftrl.spec",
        "ftrl_lower": "ftrl.lower",
        "secagg": "secagg.spec",
        "local_steps_lower": "secagg.lower",
    }.items()
}


def event_from_dict(d: dict[str, Any]) -> Any:
    """Inverse of :func:`event_to_dict`.

    Loads only dp-accounting event classes and :class:`FedprivEvent` subclasses, importing
    ``fedpriv.*`` modules on demand and other modules only if already imported.
    """
    d = dict(d)
    if "dp_event" in d:
        name = d.pop("dp_event")
        cls = getattr(dp_event, name, None)
        if not (isinstance(cls, type) and issubclass(cls, dp_event.DpEvent)):
            raise ConfigError("dp_event", name, "is not a dp_accounting DpEvent class")
        return cls(**{k: _dp_value_from_json(v) for k, v in d.items()})
    path = d.pop("fedpriv_event", None)
    module, _, name = str(path).partition(":")
    module = MOVED_EVENT_MODULES.get(module, module)
    if module.startswith("fedpriv."):
        mod = importlib.import_module(module)
    elif module in sys.modules:  # a class defined elsewhere but already imported
        mod = sys.modules[module]
    else:
        raise ConfigError(
            "fedpriv_event", path, "must name a class in a fedpriv module (or an imported one)"
        )
    cls = getattr(mod, name, None)
    if not (isinstance(cls, type) and issubclass(cls, FedprivEvent)):
        raise ConfigError("fedpriv_event", path, "is not a FedprivEvent class")
    return cls.from_dict(d)


def _dp_value_to_json(v: Any) -> Any:
    if isinstance(v, dp_event.DpEvent):
        return event_to_dict(v)
    if isinstance(v, (list, tuple)):
        return [_dp_value_to_json(x) for x in v]
    return _plain(v)


def _dp_value_from_json(v: Any) -> Any:
    if isinstance(v, dict) and "dp_event" in v:
        return event_from_dict(v)
    if isinstance(v, list):
        return [_dp_value_from_json(x) for x in v]
    return v


def _plain(v: Any) -> Any:
    """numpy scalars and tuples to plain JSON types."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _tuples(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_tuples(x) for x in v)
    return v
