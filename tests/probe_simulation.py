"""Flower's simulation engine (Ray, 2 CPUs) with ``n`` probe clients, for the SecAgg+ tests.

The probe clients (:func:`clients.secagg_probe.make_probe_client_app`) reply with integer
updates that are a known function of (seed, partition, round).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from clients.secagg_probe import make_probe_client_app
from fedpriv.run.job import wait_for_nodes

#: ``body(grid, nodes, out)``: the server's rounds, writing what the tests check into ``out``.
Body = Callable[[Grid, list[int], dict[Any, Any]], None]


def run_probe_simulation(n: int, body: Body) -> dict[Any, Any]:
    """Run ``body`` as the server of a simulation of ``n`` probe clients; return its ``out``.

    Raises
    ------
    AssertionError
        With the server's traceback, if ``body`` raised.
    """
    from flwr.simulation import run_simulation

    out: dict[Any, Any] = {}
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            body(grid, wait_for_nodes(grid, n, 60.0), out)
        except BaseException:
            out["error"] = traceback.format_exc()

    run_simulation(
        server_app=app,
        client_app=make_probe_client_app(),
        num_supernodes=n,
        backend_config={
            "init_args": {"num_cpus": 2, "include_dashboard": False},
            "client_resources": {"num_cpus": 1},
        },
    )
    assert "error" not in out, out.get("error")
    return out
