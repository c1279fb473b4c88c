"""The plain-loop baseline of ``make bench`` (benchmarks/floor_process.py, issue 27 item 6): its
round is FedAvg of one full-batch SGD step per user (checked against numpy's own softmax
regression gradient), and as a process of its own it reports its start-up, rounds and memory."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from floor_process import plain_round, run_floor_process, write_workload  # noqa: E402

RNG = np.random.default_rng(3)
X = RNG.normal(size=(12, 5)).astype(np.float32)
Y = RNG.integers(0, 3, size=12)
W0 = RNG.normal(size=(3, 5)).astype(np.float32)
B0 = RNG.normal(size=3).astype(np.float32)
USERS = [np.array([0, 1, 2]), np.array([3, 4, 5, 6]), np.array([7, 11])]
STEPS = {"lr": 0.1, "server_lr": 1.0, "divisor": 3.0}


def _numpy_round(w: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FedAvg of one full-batch SGD step per user, the mean cross-entropy's exact gradient."""
    dw, db = np.zeros_like(w, dtype=np.float64), np.zeros_like(b, dtype=np.float64)
    for idx in USERS:
        x, y = X[idx].astype(np.float64), Y[idx]
        z = x @ w.T + b
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(len(y)), y] -= 1
        dw -= STEPS["lr"] * p.T @ x / len(y)
        db -= STEPS["lr"] * p.sum(axis=0) / len(y)
    scale = STEPS["server_lr"] / STEPS["divisor"]
    return w + scale * dw, b + scale * db


def test_plain_round_is_fedavg_of_one_sgd_step() -> None:
    model = torch.nn.Linear(5, 3)
    users = [(torch.from_numpy(X[i]), torch.from_numpy(Y[i])) for i in USERS]
    glob = [torch.from_numpy(W0), torch.from_numpy(B0)]
    w, b = plain_round(model, glob, users, STEPS["lr"], STEPS["server_lr"], STEPS["divisor"])
    want_w, want_b = _numpy_round(W0, B0)
    np.testing.assert_allclose(w.numpy(), want_w, rtol=0, atol=1e-6)  # float32 arithmetic
    np.testing.assert_allclose(b.numpy(), want_b, rtol=0, atol=1e-6)


def test_the_floor_process_runs_its_rounds_and_reports(tmp_path: Path) -> None:
    write_workload(tmp_path, X, Y, [USERS, USERS[:2]], [W0, B0], STEPS)
    res = run_floor_process(tmp_path)
    assert len(res["round_time_s"]) == 2 and all(t > 0 for t in res["round_time_s"])
    assert res["wall_s"] > res["startup_s"] > 0
    assert res["peak_pss_bytes"] > 10 * 2**20  # an interpreter with torch, sampled
    inner = json.loads((tmp_path / "floor_process.json").read_text())
    assert 0 < inner["first_round_at_s"] < res["wall_s"]


@pytest.mark.parametrize("bad", ["x.npy", "steps.json"])
def test_a_missing_input_file_fails_the_process(tmp_path: Path, bad: str) -> None:
    write_workload(tmp_path, X, Y, [USERS], [W0, B0], STEPS)
    (tmp_path / bad).unlink()
    with pytest.raises(RuntimeError, match="floor process exited"):
        run_floor_process(tmp_path)
