"""The tightness table of docs/accounting.md: every analysis's ε beside its lower bound.

For each analysis of ``fedpriv-account`` at the README's setting and at a small-ε setting, the
reported ε (the budget a run spends), the printed lower bound (``lower_bound=true``: a valid
lower bound on the mechanism's ε, or a stated-confidence Monte Carlo one where the row says so)
and their ratio; for random allocation with ``k > 1`` also the Monte Carlo estimate. The
goal (issue 40) is ratio <= 1.2 everywhere; a row above it names its reason.

Usage::

    .venv/bin/python scripts/tightness_table.py            # print the Markdown table
    .venv/bin/python scripts/tightness_table.py --write    # and replace it in docs/accounting.md

``tests/test_tightness_table.py`` recomputes the rows and compares them with the docs.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedpriv.cli.account import run

DOC = Path(__file__).resolve().parents[1] / "docs" / "accounting.md"
START, END = "<!-- tightness:start -->", "<!-- tightness:end -->"
#: The goal: reported ε / lower bound at most this, unless a row names its reason.
GOAL = 1.2


@dataclass(frozen=True)
class Row:
    """One setting of one analysis: ``fedpriv-account ANALYSIS params``.

    ``slow`` rows take more than a few seconds (the test runs them in the full tier);
    ``reason`` explains a ratio above :data:`GOAL`."""

    analysis: str
    setting: str
    params: dict[str, str] = field(default_factory=dict)
    slow: bool = False
    reason: str = ""

    @property
    def command(self) -> str:
        """The shell command that prints this row's figures."""
        keys = " ".join(f"{k}={v}" for k, v in self.params.items())
        return f"fedpriv-account {self.analysis} {keys} lower_bound=true"


#: Why a row may stay above :data:`GOAL` (each names what is loose: the bound or the analysis).
SHUFFLE_REASON = (
    "the upper bound is the paper's f-DP mixture, which reveals the round holding the record "
    "(no shuffling amplification); no valid tighter analysis for replace-one fixed batches yet"
)
CHECKIN_REASON = (
    "the amplification theorems are loose and the realised pair (a count of released "
    "reports) is weak; no tighter computable pair yet"
)
SKELLAM_REASON = (
    "no lower bound: no computable statistic of the modular integer sum keeps the signal "
    "(fedpriv/accounting/skellam.py)"
)
FIXED_SIZE_REASON = (
    "the upper bound composes one pair dominating both the remove and the add profile (needed "
    "for a valid composition under replace-one: Lebeda et al., arXiv:2405.20769); the lower "
    "bound composes each realised direction (their pessimistic PLD: 0.494); the truth lies "
    "between"
)
CHECKIN_CENTRAL_REASON = (
    "with p0 < 1 the lower bound keeps each pass's first slot alone; an optimistic "
    "subsampling of the allocation's lower PLD is not written yet"
)
RDP_REASON = "the README asks for RDP with Mironov's conversion (the third paper's numbers)"


def _p(text: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in text.split())


ROWS: tuple[Row, ...] = (
    Row("gaussian", "σ = 1", _p("noise_multiplier=1 target_delta=1e-5")),
    Row("gaussian", "small ε: σ = 20", _p("noise_multiplier=20 target_delta=1e-5")),
    Row("gdp", "μ = 0.5", _p("mu=0.5 target_delta=1e-5")),
    Row(
        "poisson-gaussian",
        "README: σ 1.1, q 0.01, 10⁴ steps",
        # one step per round: every step's sum released (the lower bound's pair)
        _p("noise_multiplier=1.1 sample_rate=0.01 steps=1 num_rounds=10000 target_delta=1e-5"),
        slow=True,
    ),
    Row(
        "poisson-gaussian",
        "small ε: σ 3, q 0.001, 1,000 steps",
        _p("noise_multiplier=3 sample_rate=0.001 steps=1 num_rounds=1000 target_delta=1e-5"),
    ),
    Row(
        "batch-clipping",
        "subsample, full MNIST 64 × 1, 10 epochs, σ 1",
        _p(
            "sampling=subsample num_samples=60000 num_groups=64 group_size=1 epochs=10 "
            "noise_multiplier=1 target_delta=1e-5"
        ),
        slow=True,
        reason=FIXED_SIZE_REASON,
    ),
    Row(
        "batch-clipping",
        "subsample, small ε: N 6,000, 1 × 64, 1 epoch, σ 4",
        _p(
            "sampling=subsample num_samples=6000 num_groups=1 group_size=64 epochs=1 "
            "noise_multiplier=4 target_delta=1e-5"
        ),
    ),
    Row(
        "batch-clipping",
        "shuffle, N 600, 1 × 60, 1 epoch, σ 2",
        _p(
            "sampling=shuffle num_samples=600 num_groups=1 group_size=60 epochs=1 "
            "noise_multiplier=2 target_delta=1e-5"
        ),
        reason=SHUFFLE_REASON,
    ),
    Row(
        "checkin",
        "README: fixed window, ε0 1, 10⁴ clients, 1,000 slots",
        _p(
            "variant=fixed local_epsilon=1 num_clients=10000 num_slots=1000 "
            "checkin_probability=0.5 target_delta=1e-6"
        ),
        reason=CHECKIN_REASON,
    ),
    Row(
        "checkin",
        "shuffle, ε0 1, 1,000 clients",
        _p("variant=shuffle local_epsilon=1 num_clients=1000 target_delta=1e-6"),
        reason=CHECKIN_REASON,
    ),
    Row(
        "checkin",
        "central Gaussian slots, σ 1, 100 slots, p0 0.5, 10 passes",
        _p(
            "noise=central_gaussian noise_multiplier=1 num_clients=10000 num_slots=100 "
            "checkin_probability=0.5 repetitions=10 target_delta=1e-5"
        ),
        slow=True,
        reason=CHECKIN_CENTRAL_REASON,
    ),
    Row(
        "skellam",
        "docs: 16 bits, σ 0.9, 10 clients",
        _p(
            "noise_multiplier=0.9 bits=16 num_params=10000 num_clients=10 sample_rate=0.1 "
            "steps=10 max_grad_norm=1 target_delta=1e-5"
        ),
        reason=SKELLAM_REASON,
    ),
    Row(
        "secagg-dpsgd",
        "README: Gaussian, σ_i 0.69, 10 clients, RDP (Mironov)",
        _p(
            "mechanism=gaussian client_noise_multiplier=0.69 num_clients=10 sample_rate=0.1 "
            "steps=1 num_rounds=1 target_delta=1e-5 accountant=rdp conversion=mironov"
        ),
        reason=RDP_REASON,
    ),
    Row(
        "secagg-dpsgd",
        "the same by PLD",
        _p(
            "mechanism=gaussian client_noise_multiplier=0.69 num_clients=10 sample_rate=0.1 "
            "steps=1 num_rounds=1 target_delta=1e-5"
        ),
    ),
    Row(
        "client-level",
        "README: Poisson 2 % of 6,000, 500 rounds, z 1",
        _p(
            "noise_multiplier=1 num_clients=6000 client_sampling=poisson "
            "client_sample_rate=0.02 num_rounds=500 target_delta=1e-5"
        ),
        slow=True,
    ),
    Row(
        "client-level",
        "small ε: fixed size 12 of 6,000, 500 rounds, z 7.558",
        _p(
            "noise_multiplier=7.558 num_clients=6000 client_sampling=fixed_size "
            "num_sampled_clients=12 num_rounds=500 target_delta=1e-5"
        ),
        slow=True,
    ),
    Row(
        "client-level",
        "random allocation 1 of 50, 10 epochs, z 1",
        _p(
            "noise_multiplier=1 num_clients=1000 client_sampling=random_allocation "
            "allocation_window=50 rounds_per_client=1 num_rounds=500 target_delta=1e-5"
        ),
        slow=True,
    ),
    Row(
        "client-level",
        "random allocation 2 of 4, 1 epoch, z 1, δ 1e-3",
        _p(
            "noise_multiplier=1 num_clients=4 client_sampling=random_allocation "
            "allocation_window=4 rounds_per_client=2 num_rounds=4 target_delta=1e-3"
        ),
        slow=True,
    ),
    Row(
        "ftrl",
        "identity (plain Gaussian), z 1, 100 rounds",
        _p("factorization=identity noise_multiplier=1 num_rounds=100 target_delta=1e-5"),
    ),
)


def measure(row: Row) -> dict[str, Any]:
    """``{"epsilon", "lower", "ratio", "estimate"}`` of one row (lower/estimate ``None`` when
    the analysis prints none)."""
    out = run(row.analysis, {**row.params, "lower_bound": "true"})
    eps = float(out["epsilon"])
    lower = out.get("epsilon_lower_bound")
    lower = float(lower) if isinstance(lower, (int, float)) else None
    ratio = eps / lower if lower else math.inf
    estimate = out.get("epsilon_estimate")
    return {
        "epsilon": eps,
        "lower": lower,
        "ratio": ratio,
        "estimate": float(estimate) if isinstance(estimate, (int, float)) else None,
    }


def _fmt(value: float | None) -> str:
    if value is None:
        return "—"
    return "∞" if math.isinf(value) else f"{value:.4g}"


def render(rows: tuple[Row, ...] = ROWS) -> str:
    """The Markdown table of ``rows``, measured now."""
    lines = [
        "| analysis | setting | ε | lower bound | ratio | MC estimate | note |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        m = measure(row)
        note = row.reason or ("" if m["ratio"] <= GOAL else "ABOVE GOAL")
        lines.append(
            f"| `{row.analysis}` | {row.setting} | {_fmt(m['epsilon'])} | {_fmt(m['lower'])} "
            f"| {_fmt(m['ratio'])} | {_fmt(m['estimate'])} | {note} |"
        )
    return "\n".join(lines)


def documented() -> list[list[str]]:
    """The table's cells as written in docs/accounting.md (one list per data row)."""
    text = DOC.read_text()
    body = text.split(START, 1)[1].split(END, 1)[0]
    rows = [line for line in body.strip().splitlines() if line.startswith("| `")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in rows]


def write(table: str) -> None:
    """Replace the table between the markers of docs/accounting.md."""
    text = DOC.read_text()
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    DOC.write_text(pattern.sub(lambda _: f"{START}\n{table}\n{END}", text))


def main(argv: list[str] | None = None) -> int:
    """Print the table; ``--write`` also puts it into docs/accounting.md."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="update docs/accounting.md")
    args = parser.parse_args(argv)
    table = render()
    print(table)
    if args.write:
        write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
