"""Plots of a run: accuracy and ε against the server round (``curves.png``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def plot_curves(rounds: Sequence[dict[str, Any]], path: Path) -> None:
    """Test accuracy and ε (central, local if present, and the audit's empirical lower bound
    ``audit_epsilon_lb`` if the run is audited) per server round; a third panel with the clip
    norm when the run adapts it (``clipping_norm`` in the rows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rounds if r.get("status", "ok") == "ok"]
    x = [r["server_round"] for r in ok]
    clip = [r.get("clipping_norm") for r in ok]
    panels = 3 if any(c not in (None, "") for c in clip) else 2
    fig, axes = plt.subplots(1, panels, figsize=(4.5 * panels, 3.5))
    ax1, ax2 = axes[0], axes[1]
    marker = "o" if len(x) <= 60 else None
    ax1.plot(x, [r["accuracy"] for r in ok], marker=marker)
    ax1.set(xlabel="server round", ylabel="test accuracy", title="Accuracy")
    ax1.grid(alpha=0.3)
    ax2.plot(x, [r["epsilon"] for r in ok], marker=marker, label="central ε")
    if any(r.get("local_epsilon") not in (None, "") for r in ok):
        ax2.plot(x, [r.get("local_epsilon") for r in ok], marker="s", label="local ε (one client)")
        ax2.set_yscale("log")
    audit = [r.get("audit_epsilon_lb") for r in ok]
    if any(a not in (None, "") for a in audit):  # audit=canaries: the empirical lower bound
        ax2.plot(x, audit, marker="^", linestyle="--", label="audited ε lower bound")
    ax2.set(xlabel="server round", ylabel="ε", title="Privacy spent")
    ax2.legend()
    ax2.grid(alpha=0.3)
    from matplotlib.ticker import MaxNLocator

    if panels == 3:
        axes[2].plot(x, clip, marker=marker)
        axes[2].set(xlabel="server round", ylabel="C", title="Clip norm (adaptive)")
        axes[2].grid(alpha=0.3)
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
