"""PNG of batch occupancy per step: continuous vs static, on the same slot count."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path


def plot_occupancy(path: str | Path, series: Mapping[str, Sequence[int]], *, slots: int,
                   title: str) -> None:
    """Draw sequences scheduled per step, one line per run, against the slot count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.6), dpi=100)
    for name, occupancy in series.items():
        ax.step(range(len(occupancy)), occupancy, where="post", linewidth=1.0,
                label=f"{name} ({len(occupancy)} steps)")
    ax.axhline(slots, color="grey", linestyle=":", linewidth=1.0, label=f"{slots} slots")
    ax.set_xlabel("engine step")
    ax.set_ylabel("sequences in the step")
    ax.set_ylim(0, slots * 1.15)
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
