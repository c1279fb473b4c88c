"""What a new user tripped on, trying fedpriv from the README alone (issue 23, item 9): each
is refused with one line naming what to change, before anything is written."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fedpriv.common.errors import ConfigError
from fedpriv.run.config import compose_config
from fedpriv.run.prepare import prepare
from tests.cli import run_fedpriv

REPO = Path(__file__).resolve().parents[1]


def fedpriv(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return run_fedpriv(list(args), cwd)


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("fedpriv: error: "), proc.stderr
    return lines[0]


def test_a_key_outside_the_schema_is_refused(tmp_path: Path) -> None:
    line = one_error_line(fedpriv("+foo=1", f"hydra.run.dir={tmp_path / 'run'}"))
    assert line.startswith("fedpriv: error: foo=1 is not a fedpriv setting (known: ")
    assert not (tmp_path / "run" / "results.json").exists()
    line = one_error_line(fedpriv("+dataset.foo=1", f"hydra.run.dir={tmp_path / 'run'}"))
    assert line.startswith("fedpriv: error: dataset.foo=1 is not a fedpriv setting (known in ")


def test_config_groups_added_with_plus_still_work() -> None:
    cfg = compose_config(["+experiment=checkin_sliding_window"])
    assert cfg.client.variant == "sliding-window"  # the experiment's own settings


def test_a_file_in_the_run_directory_path_is_one_line(tmp_path: Path) -> None:
    line = one_error_line(fedpriv("hydra.run.dir=README.md/run"))
    assert line == (
        "fedpriv: error: hydra.run.dir='README.md/run' is not a directory path: README.md is a file"
    )
    assert "Traceback" not in line and "NotADirectoryError" not in line


def test_a_run_that_would_train_nothing_is_refused() -> None:
    cfg = compose_config(
        [
            "client_sampling=random_allocation",
            "allocation_window=5",
            "rounds_per_client=1",
            "num_rounds=1",
        ]
    )
    with pytest.raises(ConfigError) as info:
        prepare(cfg)
    assert str(info.value).startswith("num_rounds=1 would train nothing: no client is drawn")
    # the same sampling over a whole window trains: every client chose one of its rounds
    cfg = compose_config(
        [
            "client_sampling=random_allocation",
            "allocation_window=5",
            "rounds_per_client=1",
            "num_rounds=5",
        ]
    )
    plan, _ = prepare(cfg)
    assert sum(len(plan.cohort.draw(r)) for r in range(1, 6)) == plan.num_clients
