"""Plots of a run: accuracy and ε against the server round (``curves.png``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def plot_curves(rounds: Sequence[dict[str, Any]], path: Path) -> None:
    """Two panels: test accuracy and ε (central, and local if present) per server round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rounds if r.get("status", "ok") == "ok"]
    x = [r["server_round"] for r in ok]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
    ax1.plot(x, [r["accuracy"] for r in ok], marker="o")
    ax1.set(xlabel="server round", ylabel="test accuracy", title="Accuracy")
    ax1.grid(alpha=0.3)
    ax2.plot(x, [r["epsilon"] for r in ok], marker="o", label="central ε")
    if any(r.get("local_epsilon") not in (None, "") for r in ok):
        ax2.plot(x, [r.get("local_epsilon") for r in ok], marker="s", label="local ε (one client)")
        ax2.set_yscale("log")
    ax2.set(xlabel="server round", ylabel="ε", title="Privacy spent")
    ax2.legend()
    ax2.grid(alpha=0.3)
    from matplotlib.ticker import MaxNLocator

    for ax in (ax1, ax2):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
