"""The wire format between the server side and the clients: every message key, in one place.

Strategies and client code import these names (never each other's modules), so a key has one
spelling and one meaning.
"""

from __future__ import annotations

from collections.abc import Mapping

#: ArrayRecord of a train message: the global model's state (parameter name -> array).
MODEL_KEY = "arrays"
#: ConfigRecord of a train or query message: ``server_round`` and per-message settings.
CONFIG_KEY = "config"
#: Config field of a worker's train message and reply: the virtual client ids it trains
#: (message) or that succeeded, in the order of the stacked update rows (reply).
CLIENTS_KEY = "clients"
#: Config flag of a worker's train message and reply: the worker sums its clients' finite
#: update rows and replies with that one row (message: asked; reply: done).
SUMMED_KEY = "summed"
#: Config field of a summed worker reply: the clients whose update held NaN or +-inf (left
#: out of the sum, each a dropped client).
NON_FINITE_KEY = "non_finite"
#: Config entry of a worker's reply: the id of the Ray node it ran on ("" outside Ray).
RAY_NODE_KEY = "ray_node"
#: Config entry of a train message: the round's public parameters for the clients (JSON).
ROUND_CONFIG_KEY = "round_config"
#: ArrayRecord of a train reply: the client's (noisy) update, what the aggregator sums.
UPDATE_KEY = "update"
#: MetricRecord of a train reply: diagnostic counters, summed over clients (never weights).
METRICS_KEY = "metrics"
#: ConfigRecord carrying check-in data in queries, replies and a client's Context.state.
CHECKIN_KEY = "checkin"
#: The slot a client answers when it abstains from a random check-in.
ABSTAIN = -1


def record_int(record: Mapping[str, object], key: str, default: int | None = None) -> int:
    """The integer ``record[key]`` of a ConfigRecord (``default`` when absent).

    Raises
    ------
    TypeError
        If the value is missing without a default, or is not a number (a malformed message).
    """
    value = record.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"message field {key}={value!r} must be a number")
    return int(value)
