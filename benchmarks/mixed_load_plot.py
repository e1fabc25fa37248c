"""The PNG of ``benchmarks/mixed_load.py``: interactive TTFT over time on an idle worker and
under the batch backlog (top), and the worker's decode rows per second over the backlog
part, the interactive traffic's window shaded, beside the control run's (bottom).
matplotlib is the ``bench`` extra."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cli.bench.plot import MISSING_MATPLOTLIB

BIN_S = 2.0  # width of one bar of the bottom panel
MEAN_S = 10.0  # width of one point of its lines


def binned(steps: list[list[float]], origin: float, width: float) -> dict[int, float]:
    """Decode rows per second in bins of ``width`` seconds from ``origin``: bin -> rate."""
    bins: dict[int, float] = {}
    for t, decode_rows, _running, _ms in steps:
        key = int((t - origin) // width)
        bins[key] = bins.get(key, 0.0) + decode_rows / width
    return bins


def plot_ttft(path: str | Path, fig: dict[str, Any]) -> None:
    """Draw the figures of one run (``mixed_load.run``'s dict) to ``path``."""
    try:
        import matplotlib
    except ImportError as exc:
        raise RuntimeError(MISSING_MATPLOTLIB) from exc

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.4), dpi=100)
    for name, colour in (("idle", "tab:green"), ("backlog", "tab:red")):
        rows = [r for r in fig["requests"][name] if r["ttft"] is not None]
        if not rows:
            continue
        start = min(r["sent"] for r in rows)
        p99 = fig[name]["ttft_p99_s"]
        top.plot([r["sent"] - start for r in rows], [r["ttft"] * 1000 for r in rows], ".-",
                 color=colour, linewidth=0.8, markersize=4,
                 label=f"{name}: p99 {p99 * 1000:.0f} ms" if p99 is not None else name)
    top.set_xlabel("seconds since the part's first interactive request")
    top.set_ylabel("TTFT, ms")
    top.set_ylim(bottom=0)
    top.legend(loc="upper right", fontsize=8)
    top.set_title("Interactive streams: time to first token, idle worker and batch backlog")

    steps = fig["steps"]
    if steps:
        origin = fig["windows"]["alone"][0]
        bins = binned(steps, origin, BIN_S)
        xs = sorted(bins)
        bottom.bar([x * BIN_S for x in xs], [bins[x] for x in xs], width=BIN_S,
                   align="edge", color="tab:blue", alpha=0.5,
                   label="decode rows/s (batch + interactive)")
        for name, series, colour in (("this run", steps, "tab:blue"),
                                     ("control run, the batch alone", fig.get("control_steps"),
                                      "black")):
            if series:
                means = binned(series, origin, MEAN_S)
                xs = sorted(means)
                bottom.plot([(x + 0.5) * MEAN_S for x in xs], [means[x] for x in xs], "-",
                            color=colour, linewidth=1.2, label=f"{name}, {MEAN_S:.0f} s means")
        a, b = (w - origin for w in fig["windows"]["mixed"])
        bottom.axvspan(a, b, color="tab:red", alpha=0.12, label="interactive traffic")
        bottom.set_xlabel("seconds since the batch's measured start")
        bottom.set_ylabel("tokens/s")
        bottom.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
