"""One PNG of the scaling curves from the JSON of the three scaling benchmarks.

    .venv/bin/python benchmarks/plot_scaling.py --generate docs/bench_scale_generate.json \
        --batch docs/bench_scale_batch.json --listing docs/bench_listing_scale.json \
        --out docs/bench_scaling.png

Log-log axes with each curve's least-squares line (fixed cost + cost per unit) dotted: a
stage whose cost grows linearly with the work sits on its dotted curve; a quadratic one
bends away above it. Needs matplotlib
(``pip install 'inflight[bench]'``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from cli.bench.plot import Series, plot_panels


def generate_panel(data: dict[str, Any]) -> Series:
    """``inflight generate``'s wall time and peak RSS against the line count."""
    rows = data["rows"]
    xs = [r["lines"] for r in rows]
    return {"inflight generate, wall s": (xs, [r["cli"]["wall_s"] for r in rows]),
            "peak RSS, GiB": (xs, [r["cli"]["peak_rss"] / 2**30 for r in rows])}


def batch_panel(data: dict[str, Any]) -> Series:
    """The batch stages (seconds) against the line count."""
    rows = data["rows"]
    xs = [r["lines"] for r in rows]
    return {stage.removesuffix("_s"): (xs, [max(r[stage], 1e-3) for r in rows])
            for stage in ("upload_s", "expansion_s", "run_s", "finalize_s", "download_s")}


def listing_panel(data: dict[str, Any]) -> Series:
    """Walk times (seconds) and the CLI against the tenant's row count."""
    rows = data["rows"]
    xs = [r["rows"] for r in rows]
    return {"keyset walk, tenant": (xs, [r["walk_s"] for r in rows]),
            "keyset walk, all tenants": (xs, [r["walk_all_tenants_s"] for r in rows]),
            "inflight jobs --limit 0": (xs, [r["cli_s"] for r in rows])}


def main(argv: list[str] | None = None) -> int:
    """Read the three JSON files and draw the PNG."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--generate", required=True)
    p.add_argument("--batch", required=True)
    p.add_argument("--listing", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    def load(path: str) -> dict[str, Any]:
        return json.loads(Path(path).read_text())

    panels = [
        ("inflight generate", "input lines", "seconds / GiB", generate_panel(load(args.generate))),
        ("batch through the API, 2 workers", "input lines", "seconds",
         batch_panel(load(args.batch))),
        ("job listing", "tenant rows", "seconds", listing_panel(load(args.listing))),
    ]
    plot_panels(args.out, panels, title="Cost against the work (dotted: each curve's least-squares line)")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
