"""Per-slot overhead of random check-ins on the worker engine, through Flower's simulation.

Runs ``+experiment=checkin_adult`` (UCI Adult, logistic regression, Laplace eps0 = 1, fixed
window, p0 = 1) with ``--clients`` virtual clients on the default workers (one per local Ray
actor) and ``--slots`` slots per pass, once per ``--batch-size``, and prints for every pass:

* ``slots`` and ``round trips`` (``send_and_receive`` calls: one per block of ``b`` slots
  with at least one check-in; dummy slots need none);
* ``pass s``: the wall time of the pass (check-in query and update slots);
* ``compute s``: what the pass computes, measured in the same run: the workers' own
  per-client compute (model load, gradient, randomizer; ``client_compute_s``) plus the
  server's dummy updates, slot means and model steps (``server_compute_s``); the test
  evaluation (once per pass here, ``eval_s``) is shown apart and not counted as overhead;
* ``overhead ms/slot`` = (pass s - compute s - eval s) / slots, the issue's figure (the
  check-in query is counted as overhead, in full);
* ``bound ms/slot``: the same with only the compute on the critical path subtracted (per
  block, the busiest worker's compute: the workers compute in parallel), an upper bound on
  the overhead;
* ``ms/round trip``: (slot phase - critical-path compute - eval) / round trips, the
  engine's latency per ``send_and_receive``.

Run: ``.venv/bin/python benchmarks/bench_checkin.py`` (n = m = 1000, b = 1 and 32, about
1-2 minutes) or ``.venv/bin/python benchmarks/bench_checkin.py --clients 10000 --slots 10000
--batch-size 1 100``. Needs ``../shared/data/adult``. ``--flower-sweep 0.001`` is a diagnostic
(it patches Flower's engine, see :func:`patch_flower_sweep`), not a fedpriv setting.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _cfg(overrides: list[str]) -> Any:
    from fedpriv.run.config import compose_config

    return compose_config(["+experiment=checkin_adult", *overrides])


def run(clients: int, slots: int, batch: int, passes: int, extra: list[str]) -> list[dict]:
    """One run; returns its rounds (one per pass) from results.json."""
    from fedpriv.run.runner import run_experiment

    overrides = [
        f"num_clients={clients}",
        f"client.num_slots={slots}",
        f"strategy.batch_size={batch}",
        f"strategy.eval_every={slots}",  # one test evaluation per pass
        f"num_rounds={passes}",
        f"dataset.data_dir={REPO.parent / 'shared' / 'data' / 'adult'}",
        "progress=false",
        "plot=false",
        "save_model=false",
        *extra,
    ]
    with tempfile.TemporaryDirectory() as out:
        run_experiment(_cfg(overrides), Path(out))
        return json.loads((Path(out) / "results.json").read_text())["rounds"]


def patch_flower_sweep(seconds: float) -> None:
    """DIAGNOSTIC ONLY: make Flower's simulation engine hand stored messages to its workers
    every ``seconds`` instead of its hard-coded 0.1 s (``add_messages_to_queue`` in
    ``flwr/server/superlink/fleet/vce/vce_api.py``), to show what that sleep costs a round
    trip. fedpriv never does this; figures measured with it are not fedpriv's."""
    import threading

    from flwr.server.superlink.fleet.vce import vce_api

    def add_messages_to_queue(
        state: Any, queue: Any, nodes_mapping: Any, f_stop: threading.Event
    ) -> None:
        while not f_stop.is_set():
            for node_id in nodes_mapping.keys():
                for msg in state.get_message_ins(node_id=node_id, limit=1):
                    queue.put(msg)
            f_stop.wait(seconds)

    vce_api.add_messages_to_queue = add_messages_to_queue  # type: ignore[assignment]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=1000, help="n (virtual clients)")
    ap.add_argument("--slots", type=int, default=1000, help="m (slots per pass)")
    ap.add_argument("--batch-size", type=int, nargs="+", default=[1, 32], help="b values")
    ap.add_argument("--passes", type=int, default=1, help="passes per run (fresh check-ins)")
    ap.add_argument(
        "--flower-sweep",
        type=float,
        default=None,
        help="DIAGNOSTIC: patch Flower's 0.1 s delivery sweep to this many seconds",
    )
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. num_workers=2")
    args = ap.parse_args()
    if args.flower_sweep is not None:
        patch_flower_sweep(args.flower_sweep)
    sweep = "" if args.flower_sweep is None else f", DIAGNOSTIC Flower sweep {args.flower_sweep} s"
    lines = [
        f"random check-ins, fixed window, n={args.clients}, m={args.slots}, "
        f"overrides={args.overrides or 'none'}{sweep}",
        f"{'b':>4} {'pass':>4} {'slots':>6} {'round trips':>11} {'pass s':>8} {'check-in s':>10} "
        f"{'compute s':>9} {'eval s':>6} {'overhead ms/slot':>16} {'bound ms/slot':>13} "
        f"{'ms/round trip':>13}",
    ]
    for b in args.batch_size:
        t0 = time.monotonic()
        rounds = run(args.clients, args.slots, b, args.passes, args.overrides)
        for r in rounds:  # the rows' figures are the strategy's (strategies/checkin_server.py)
            compute = r["client_compute_s"] + r["server_compute_s"]
            critical = r["client_critical_s"] + r["server_compute_s"]
            slot_phase = r["round_time_s"] - r["checkin_s"]
            trips = max(r["round_trips"], 1.0)
            lines.append(
                f"{b:>4} {r['server_round']:>4} {int(r['slots']):>6} {int(r['round_trips']):>11} "
                f"{r['round_time_s']:>8.2f} {r['checkin_s']:>10.2f} {compute:>9.2f} "
                f"{r['eval_s']:>6.2f} {r['overhead_ms_per_slot']:>16.2f} "
                f"{r['overhead_bound_ms_per_slot']:>13.2f} "
                f"{1000 * (slot_phase - critical - r['eval_s']) / trips:>13.1f}"
            )
        lines.append(f"     (b={b}: {time.monotonic() - t0:.0f} s wall, engine start included)")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
