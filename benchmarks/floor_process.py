"""The plain-loop floor as a process of its own: the start-up and memory baseline of `make bench`.

``bench_clients.py`` writes a workload's data into a folder (:func:`write_workload`: training
rows flattened, labels, each round's cohort as row indices per client, the initial weights,
the learning rates); this script, run as ``python floor_process.py FOLDER OUT.json``, imports
only numpy and torch, maps the rows, and runs the rounds with :func:`plain_round` (one thread),
the step ``bench_clients.Floor`` times in-process. It writes the seconds from its first line to
its first round and each round's time; the parent times the whole process (interpreter start
included) and samples its Σ PSS (:func:`run_floor_process`). What a plain single-process
loop costs around its rounds is the baseline fedpriv's start-up and memory are divided by
(pfl is the other baseline, in ``../shared/bench/peer-pfl/``).
"""

from __future__ import annotations

import time

T0 = time.monotonic()

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402


def plain_round(
    model: Any,
    glob: list[Any],
    users: list[tuple[Any, Any]],
    lr: float,
    server_lr: float,
    divisor: float,
) -> list[Any]:
    """Every user's full-batch SGD step from ``glob`` (cross-entropy), the deltas summed, the
    server step ``glob + server_lr * sum / divisor``; returns the new weights."""
    import torch

    params = list(model.parameters())
    total = [torch.zeros_like(g) for g in glob]
    for x, y in users:
        with torch.no_grad():
            for p, g in zip(params, glob, strict=True):
                p.copy_(g)
        for p in params:
            p.grad = None
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        with torch.no_grad():
            for p, g, t in zip(params, glob, total, strict=True):
                p.sub_(lr * p.grad)
                t.add_(p - g)
    with torch.no_grad():
        return [g + server_lr * t / divisor for g, t in zip(glob, total, strict=True)]


def write_workload(
    folder: Path,
    x: np.ndarray,
    y: np.ndarray,
    cohorts: list[list[np.ndarray]],
    glob0: list[np.ndarray],
    steps: dict[str, float],
) -> None:
    """The files :func:`main` reads: ``x.npy`` (rows, features) float32, ``y.npy``, per round
    ``r`` the clients' row indices concatenated (``idx_r.npy``) with their ``offsets_r.npy``,
    ``w.npy``/``b.npy`` the logistic layer, ``steps.json`` (lr, server_lr, divisor)."""
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "x.npy", np.ascontiguousarray(x.reshape(len(x), -1), dtype=np.float32))
    np.save(folder / "y.npy", y)
    for r, users in enumerate(cohorts):
        np.save(folder / f"idx_{r}.npy", np.concatenate(users).astype(np.int64))
        np.save(folder / f"offsets_{r}.npy", np.cumsum([0, *map(len, users)]))
    np.save(folder / "w.npy", glob0[0])
    np.save(folder / "b.npy", glob0[1])
    (folder / "steps.json").write_text(json.dumps({**steps, "rounds": len(cohorts)}))


def run_floor_process(folder: Path, interval: float = 0.1) -> dict[str, Any]:
    """Run this script on ``folder`` in a fresh interpreter; its figures: ``wall_s`` (command to
    exit), ``startup_s`` (the wall time outside its rounds), ``round_time_s``,
    ``peak_pss_bytes`` (Σ PSS of the process, sampled every ``interval`` s)."""
    from bench_clients import tree_memory

    out = folder / "floor_process.json"
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, __file__, str(folder), str(out)])
    peak = [0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], tree_memory(proc.pid)[1])
            time.sleep(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    code = proc.wait()
    wall = time.monotonic() - t0
    sampler.join()
    if code != 0:
        raise RuntimeError(f"the floor process exited {code}")
    res = json.loads(out.read_text())
    return {
        "wall_s": wall,
        "startup_s": wall - sum(res["round_time_s"]),
        "round_time_s": res["round_time_s"],
        "peak_pss_bytes": peak[0],
    }


def main(folder: Path, out: Path) -> None:
    """Load the workload, run its rounds, write ``{"first_round_at_s", "round_time_s"}``."""
    import torch

    torch.set_num_threads(1)
    x = np.load(folder / "x.npy", mmap_mode="r")  # mapped, as fedpriv maps a large set
    y = np.load(folder / "y.npy")
    steps = json.loads((folder / "steps.json").read_text())
    w, b = (torch.from_numpy(np.load(folder / f"{k}.npy")) for k in ("w", "b"))
    model = torch.nn.Linear(w.shape[1], w.shape[0])
    glob, times = [w, b], []
    first = time.monotonic() - T0
    for r in range(int(steps["rounds"])):
        idx, off = np.load(folder / f"idx_{r}.npy"), np.load(folder / f"offsets_{r}.npy")
        rows = [idx[a:z] for a, z in zip(off[:-1], off[1:], strict=True)]
        users = [(torch.from_numpy(x[i]), torch.from_numpy(y[i])) for i in rows]
        start = time.perf_counter()
        glob = plain_round(model, glob, users, steps["lr"], steps["server_lr"], steps["divisor"])
        times.append(time.perf_counter() - start)
    out.write_text(json.dumps({"first_round_at_s": first, "round_time_s": times}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
