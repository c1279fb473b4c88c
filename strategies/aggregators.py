"""Re-export of the aggregator interface and the ideal aggregator (:mod:`fedpriv.aggregation`)."""

from fedpriv.aggregation import (  # noqa: F401
    NON_FINITE,
    AggregateResult,
    Aggregator,
    IdealAggregator,
    RoundFailed,
    error_reason,
    is_finite_reply,
    sum_replies,
)
