"""How ``fedpriv-account ... lower_bound=true`` reports a lower bound on ε.

Every analysis answers ``epsilon_lower_bound`` (a number at most its ``epsilon``, or a sentence
beginning :data:`NOT_AVAILABLE` with the reason) and ``lower_bound_method`` (what the number
is: the theorem and the realised pair). docs/accounting.md lists each analysis's bound.
"""

from __future__ import annotations

from typing import Any

from fedpriv.accounting.core.params import Params

__all__ = ["LOWER_BOUND_KEY", "NOT_AVAILABLE", "lower_bound_entry", "wants_lower_bound"]

#: The CLI key that asks for the lower bound (``true``/``false``, default ``false``).
LOWER_BOUND_KEY = "lower_bound"
#: How an analysis without a justified lower bound says so (followed by the reason).
NOT_AVAILABLE = "not available for this analysis: "


def wants_lower_bound(p: Params) -> bool:
    """``lower_bound=true|false`` (default false); a bad value is refused in one line."""
    return p.bool(LOWER_BOUND_KEY, False)


def lower_bound_entry(bound: float | None, method: str) -> dict[str, Any]:
    """``{"epsilon_lower_bound": bound, "lower_bound_method": method}``; with ``bound=None``
    the value is :data:`NOT_AVAILABLE` followed by ``method`` (the reason)."""
    if bound is None:
        return {"epsilon_lower_bound": NOT_AVAILABLE + method}
    return {"epsilon_lower_bound": float(bound), "lower_bound_method": method}
