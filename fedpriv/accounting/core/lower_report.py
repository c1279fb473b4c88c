"""How ``fedpriv-account ... lower_bound=true`` reports a lower bound on ε.

Every spec answers :meth:`PrivacySpec.lower_bound(num_rounds)
<fedpriv.accounting.core.privacy_spec.PrivacySpec.lower_bound>` with a :class:`LowerBound`; the
CLI prints its :meth:`LowerBound.entries`: ``epsilon_lower_bound`` (a number at most the
answer's ``epsilon``, or a sentence beginning :data:`NOT_AVAILABLE` with the reason),
``lower_bound_method`` (the theorem and the realised pair), ``epsilon_lower_bound_confidence``
(the probability that the number bounds ε: 1 for a sure bound, below 1 for a Monte Carlo one)
and, where the family states its parts, ``lower_bound_detail``. docs/accounting.md lists each
analysis's bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LOWER_BOUND_KEY", "NOT_AVAILABLE", "LowerBound"]

#: The CLI key that asks for the lower bound (``true``/``false``, default ``false``).
LOWER_BOUND_KEY = "lower_bound"
#: How an analysis without a justified lower bound says so (followed by the reason).
NOT_AVAILABLE = "not available for this analysis: "


@dataclass(frozen=True)
class LowerBound:
    """A lower bound on the ε of a spec after some rounds, and how it was obtained.

    Attributes
    ----------
    value : float or None
        The bound (``inf`` for a release without noise); ``None``: no bound is computed, and
        ``method`` says why.
    method : str
        What the number is (theorem, realised pair, rounding), or why there is none.
    confidence : float
        In (0, 1]: the probability that ``value`` bounds ε (1: a sure bound; a Monte Carlo
        bound states its own).
    detail : dict
        Each part's value, where the bound is the largest of several (may be empty).
    """

    value: float | None
    method: str
    confidence: float = 1.0
    detail: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def not_available(cls, reason: str) -> LowerBound:
        """No bound, with the reason (printed after :data:`NOT_AVAILABLE`)."""
        return cls(None, reason)

    @classmethod
    def of_events(
        cls, events: list[tuple[Any, int]], target_delta: float, method: str, why_not: str = ""
    ) -> LowerBound:
        """The optimistic bound of ``events`` (``[(event, count), ...]``, each event's realised
        pair) at ``target_delta`` (:func:`~fedpriv.accounting.core.lower_bound.
        epsilon_lower_bound`); ``why_not`` (default: no lower PLD for an event) when an event
        has no pair here."""
        from fedpriv.accounting.core.lower_bound import epsilon_lower_bound

        bound = epsilon_lower_bound(events, target_delta)
        if bound is None:
            return cls.not_available(why_not or "an event has no realised pair computed here")
        return cls(bound, method)

    def entries(self) -> dict[str, Any]:
        """The CLI's entries: ``epsilon_lower_bound`` and, for a number, its method,
        confidence (a float in (0, 1]) and detail."""
        if self.value is None:
            return {"epsilon_lower_bound": NOT_AVAILABLE + self.method}
        out: dict[str, Any] = {
            "epsilon_lower_bound": float(self.value),
            "lower_bound_method": self.method,
            "epsilon_lower_bound_confidence": float(self.confidence),
        }
        if self.detail:
            out["lower_bound_detail"] = self.detail
        return out

    def __post_init__(self) -> None:
        if not (0.0 < self.confidence <= 1.0) or math.isnan(self.confidence):
            raise ValueError(f"confidence={self.confidence!r} must be in (0, 1]")
