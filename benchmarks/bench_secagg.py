"""Round time of the SecAgg+ aggregator against the ideal one, through the Flower engine.

Ten probe clients (``clients.secagg_probe.make_probe_client_app``) each reply with a fixed 32-bit
integer update shaped like the tanh CNN (26,010 parameters); the server alternates ideal and
SecAgg+ rounds on the same inputs and reports the median wall time of each. ``work_seconds``
adds a sleep in every client's handler standing in for local training (the same in both
modes), so the ratio for a round of a given length can be read off. ``dropout`` makes that
fraction of the clients (a fresh random set each round, the same for both aggregators) raise
in their training handler, after the key stages: SecAgg+ must then reconstruct their masks.
Every round checks that the SecAgg+ sum equals the ideal one bit for bit.

Run: ``.venv/bin/python benchmarks/bench_secagg.py [--work-seconds 0.5] [--dropout 0.1]``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

from clients.secagg_probe import make_probe_client_app
from fedpriv.run.aggregation import AggregateResult, Aggregator, IdealAggregator
from fedpriv.run.job import wait_for_nodes
from strategies.secaggplus import SecAggPlusAggregator


def cnn_shapes() -> dict[str, list[int]]:
    """Parameter shapes of the tanh CNN (26,010 parameters)."""
    from fedpriv.models.zoo import TanhCNN

    return {k: list(v.shape) for k, v in TanhCNN().state_dict().items()}


def _messages(
    nodes: list[int],
    server_round: int,
    shapes: dict[str, list[int]],
    work_seconds: float,
    dropout: float = 0.0,
) -> list[Message]:
    rng = np.random.default_rng([1, server_round])
    failing = rng.choice(len(nodes), size=round(dropout * len(nodes)), replace=False)
    cfg = ConfigRecord(
        {
            "seed": 0,
            "server_round": server_round,
            "bits": 32,
            "shapes": json.dumps(shapes),
            "work_seconds": float(work_seconds),
            "fail_partitions": [int(p) for p in sorted(failing)],
        }
    )
    return [
        Message(
            RecordDict({"config": cfg}),
            dst_node_id=n,
            message_type=MessageType.TRAIN,
            group_id=str(server_round),
        )
        for n in nodes
    ]


def _timed(
    agg: Aggregator, grid: Grid, msgs: list[Message], server_round: int
) -> tuple[float, AggregateResult]:
    t0 = time.perf_counter()
    result = agg.sum_updates(grid, msgs, server_round=server_round, timeout=120.0)
    return time.perf_counter() - t0, result


def _same_sum(a: AggregateResult, b: AggregateResult) -> bool:
    """Whether two aggregators revealed the same clients' exact sum."""
    return a.total.keys() == b.total.keys() and all(
        np.array_equal(a.total[k], b.total[k]) for k in a.total
    )


def bench_secagg(
    num_clients: int = 10,
    rounds: int = 3,
    work_seconds: float = 0.0,
    num_cpus: int = 2,
    pull_interval: float | None = None,
    num_shares: int | float | str = 1.0,
    reconstruction_threshold: int | float = 0.5,
    dropout: float = 0.0,
) -> dict[str, Any]:
    """Median round seconds of ideal and SecAgg+ aggregation (after one warm-up round each).

    ``pull_interval`` (s), if given, replaces the in-memory grid's reply polling period
    (Flower's default 0.1 s; every ``send_and_receive`` waits at least one period, and SecAgg+
    makes four of them per round against the ideal aggregator's one).

    Returns
    -------
    dict
        ``{"num_clients", "num_params", "work_seconds", "dropout", "num_shares", "shares",
        "reconstruction_threshold", "ideal_s", "secaggplus_s", "ratio", "dropped",
        "same_sum"}``: ``shares`` is the count ``num_shares`` resolved to, ``same_sum``
        whether every round's SecAgg+ sum equalled the ideal one bit for bit, ``dropped``
        the clients SecAgg+ left out of the last round.

    Raises
    ------
    RoundFailed
        If a round fails (e.g. a client keeps fewer live neighbours than the threshold).
    """
    from flwr.simulation import run_simulation

    shapes = cnn_shapes()
    times: dict[str, list[float]] = {"ideal": [], "secaggplus": []}
    secagg = SecAggPlusAggregator(
        num_shares=num_shares,
        reconstruction_threshold=reconstruction_threshold,
        max_dropout=max(dropout, 0.1),
    )
    aggs: dict[str, Aggregator] = {"ideal": IdealAggregator(min_replies=1), "secaggplus": secagg}
    same: list[bool] = []
    errors: list[BaseException] = []
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            nodes = wait_for_nodes(grid, num_clients, 120.0)
            if pull_interval is not None and hasattr(grid, "pull_interval"):
                grid.pull_interval = pull_interval
            for r in range(rounds + 1):
                sums = []
                for name, agg in aggs.items():
                    msgs = _messages(nodes, r + 1, shapes, work_seconds, dropout)
                    seconds, result = _timed(agg, grid, msgs, r + 1)
                    sums.append(result)
                    if r > 0:
                        times[name].append(seconds)
                same.append(_same_sum(*sums))
        except BaseException as exc:  # reported after the engine stops
            errors.append(exc)

    run_simulation(
        server_app=app,
        client_app=make_probe_client_app(),
        num_supernodes=num_clients,
        backend_config={
            "init_args": {"num_cpus": num_cpus, "include_dashboard": False},
            "client_resources": {"num_cpus": 1},
        },
    )
    if errors:
        raise errors[0]
    ideal, sec = statistics.median(times["ideal"]), statistics.median(times["secaggplus"])
    return {
        "num_clients": num_clients,
        "num_params": sum(math.prod(s) for s in shapes.values()),
        "work_seconds": work_seconds,
        "dropout": dropout,
        "pull_interval": pull_interval,
        "num_shares": num_shares,
        "shares": secagg.shares_for(num_clients)[0],
        "reconstruction_threshold": reconstruction_threshold,
        "ideal_s": ideal,
        "secaggplus_s": sec,
        "ratio": sec / ideal,
        "dropped": secagg.last_num_dropped,
        "same_sum": all(same),
    }


def main() -> None:
    """Command-line entry: print one JSON line per ``--work-seconds`` value."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work-seconds", type=float, nargs="+", default=[0.0])
    parser.add_argument("--pull-interval", type=float, default=None)
    parser.add_argument(
        "--num-shares",
        default="auto",
        help="auto (SecAggPlusAggregator's rule), a fraction of the clients (<= 1) or a count",
    )
    parser.add_argument("--reconstruction-threshold", type=float, default=0.5)
    parser.add_argument("--dropout", type=float, nargs="+", default=[0.0])
    args = parser.parse_args()
    shares = _shares(args.num_shares)
    for work in args.work_seconds:
        for dropout in args.dropout:
            row = bench_secagg(
                args.num_clients,
                args.rounds,
                work,
                pull_interval=args.pull_interval,
                num_shares=shares,
                reconstruction_threshold=args.reconstruction_threshold,
                dropout=dropout,
            )
            print(json.dumps(row), flush=True)


def _shares(text: str) -> int | float | str:
    """``--num-shares``: ``"auto"``, a fraction (<= 1) or a count."""
    if text == "auto":
        return text
    value = float(text)
    return value if value <= 1 else int(value)


if __name__ == "__main__":
    main()
