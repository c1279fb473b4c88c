"""Issue 28 item 2: parameter averaging (EMA) of the global model for evaluation
(``strategy.ema_decay``; De et al. 2022, arXiv:2204.13650, Section 3.1).

The average is post-processing of released models: ε is the same with and without it. It is
checked against the formula ``ema = d ema + (1 - d) model`` by hand, and it survives a resume:
a run stopped after round 2 and resumed gives the uninterrupted run's ``ema_accuracy`` rows.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from fedpriv.common.errors import ConfigError
from fedpriv.run.prepare import build_server, prepare
from fedpriv.run.resume import resume_config
from fedpriv.run.runner import run_experiment
from strategies.fedavg import DPFedAvg
from tests.cli import run_fedpriv
from tests.test_faults import _cfg

TINY = ["num_clients=4", "model=logistic", "progress=false", "client.steps=2", "plot=false"]


def test_the_average_follows_the_formula() -> None:
    strategy = DPFedAvg(ema_decay=0.75)
    seen: list[dict[str, np.ndarray]] = []
    job = SimpleNamespace(evaluate_state=lambda s: (seen.append(s) or float(s["w"][0]), 0.0))
    states = [
        {"w": np.array([x], dtype=np.float32), "n": np.array([i])}
        for i, x in enumerate([4.0, 8.0, 0.0])
    ]
    out = [strategy.evaluate_average(s, job)["ema_accuracy"] for s in states]  # type: ignore[arg-type]
    first = 4.0
    second = 0.75 * first + 0.25 * 8.0
    third = 0.75 * second + 0.25 * 0.0
    assert out == pytest.approx([first, second, third], rel=1e-6)
    assert seen[-1]["n"].tolist() == [2]  # a non-float array follows the model
    saved = strategy.saved_state()
    assert saved["ema/w"].tolist() == pytest.approx([third])
    again = DPFedAvg(ema_decay=0.75)
    again.restore_saved_state(saved)
    assert again.saved_state().keys() == saved.keys()


def _rows(run_dir: Path) -> list[tuple[float, float, float]]:
    res = json.loads((run_dir / "results.json").read_text())
    return [(r["epsilon"], r["accuracy"], r["ema_accuracy"]) for r in res["rounds"]]


def test_the_average_is_evaluated_every_round_and_survives_a_resume(tmp_path: Path) -> None:
    over = [*TINY, "strategy.ema_decay=0.9", "engine=processes"]
    whole = run_experiment(_cfg([*over, "num_rounds=4"]), tmp_path / "whole")
    assert whole["status"] == "complete", whole["message"]
    rows = _rows(tmp_path / "whole")
    assert len(rows) == 4 and all(0 <= r[2] <= 1 for r in rows)
    assert rows[0][1] == rows[0][2]  # the first released model starts the average
    plain = run_experiment(_cfg([*TINY, "num_rounds=4", "engine=processes"]), tmp_path / "plain")
    assert [r["epsilon"] for r in plain["rounds"]] == [r[0] for r in rows]  # ε unchanged
    run_experiment(_cfg([*over, "num_rounds=2"]), tmp_path / "part")
    resumed = run_experiment(resume_config(tmp_path / "part", ["num_rounds=4"]), tmp_path / "part")
    assert resumed["status"] == "complete"
    assert _rows(tmp_path / "part") == rows


@pytest.mark.parametrize("bad", ["1.0", "-0.1"])
def test_a_bad_decay_is_refused_naming_the_field(bad: str) -> None:
    with pytest.raises(ConfigError, match=rf"strategy.ema_decay={bad} must be null \(off\)"):
        plan, algorithm = prepare(_cfg([*TINY, f"strategy.ema_decay={bad}"]))
        build_server(plan, algorithm)


def test_the_final_line_gives_the_average_beside_the_model(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_fedpriv([*TINY, "num_rounds=1", "strategy.ema_decay=0.9", f"hydra.run.dir={out}"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = json.loads((out / "results.json").read_text())["rounds"][-1]
    want = f"final: accuracy={last['accuracy']:.4f} ema_accuracy={last['ema_accuracy']:.4f} "
    assert want in proc.stdout
