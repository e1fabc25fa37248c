"""PNG of batch occupancy per step: continuous vs static, on the same slot count.

matplotlib is an optional extra (``pip install 'inflight[bench]'``): it is imported only
when a plot is drawn, so runs that draw none work without it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path

from cli.bench.linear_fit import fit_line

MISSING_MATPLOTLIB = "plots need matplotlib: pip install 'inflight[bench]'"


def has_matplotlib() -> bool:
    """Whether matplotlib is installed (checked without importing it)."""
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):
        return False


def plot_occupancy(path: str | Path, series: Mapping[str, Sequence[int]], *, slots: int,
                   title: str) -> None:
    """Draw sequences scheduled per step, one line per run, against the slot count."""
    try:
        import matplotlib
    except ImportError as exc:
        raise RuntimeError(MISSING_MATPLOTLIB) from exc

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


Series = Mapping[str, tuple[Sequence[float], Sequence[float]]]  # label -> (xs, ys)


def plot_panels(path: str | Path, panels: Sequence[tuple[str, str, str, Series]], *,
                title: str) -> None:
    """Draw one log-log panel per ``(title, x label, y label, series)`` side by side, each
    series as points joined by a line, with its least-squares line ``a + b * x`` dotted
    (on a denser grid): a cost that grows linearly sits on its dotted curve."""
    try:
        import matplotlib
    except ImportError as exc:
        raise RuntimeError(MISSING_MATPLOTLIB) from exc

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 3.8), dpi=100)
    for ax, (panel_title, xlabel, ylabel, series) in zip(axes, panels, strict=True):
        for label, (xs, ys) in series.items():
            line = ax.plot(xs, ys, marker="o", linewidth=1.2, label=label)[0]
            fit = fit_line(xs, ys)
            grid = [xs[0] * (xs[-1] / xs[0]) ** (i / 40) for i in range(41)]
            ax.plot(grid, [max(fit.intercept + fit.slope * x, ys[0] * 0.5) for x in grid],
                    linestyle=":", linewidth=0.9, color=line.get_color())
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(panel_title, fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
