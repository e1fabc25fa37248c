"""Quote accuracy: what ``POST /v1/batches`` with ``"dry_run": true`` estimated for the chat
workload, against what the batch then took.

    .venv/bin/python benchmarks/quote_accuracy.py [--lines 263] [--rounds 2] [--model smollm2-135m]

A throwaway service (``benchmarks/service_stack.py``: its own PostgreSQL database, Redis
prefix, ``inflight api`` and ``--workers`` ``inflight worker`` processes) first runs a small
warm-up, twice a batch of ``--warmup`` lines (the live workers then have measured costs:
their first steps are not measured, ``worker/store/crud/throughput.py``; and the tenant a
little history). Then, ``--rounds`` times: quote the first ``--lines`` requests of
the chat workload, create the batch at once, wait until it is completed, and compare

- **engine-seconds**: the quote's ``engine_seconds`` against the batch's
  ``usage.engine_seconds`` (the jobs' shares of the steps they ran in);
- **completion**: the quote's ``estimated_completion_at`` less the time of the quote,
  against the batch's ``completed_at`` less its ``created_at``;
- **output tokens**: expected against produced.

Round 1 prices the workload at the warm-up's costs and history; from round 2 on, the
rounds before it are the history (the target: within ±20%). The errors are estimate /
actual - 1. Not a test: it prints a table and the JSON of every round.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.chat_batches import batch_file, create, upload, wait_completed
from benchmarks.service_stack import service_stack
from cli.bench.machine import cpu_description


def _error(estimate: float | None, actual: float) -> float | None:
    return None if estimate is None or not actual else estimate / actual - 1.0


def one_round(client: Any, file_id: str) -> dict[str, Any]:
    """Quote, run and measure one batch of ``file_id``."""
    quoted_at = time.time()
    quote = create(client, file_id, dry_run=True)
    batch = create(client, file_id)
    done = wait_completed(client, batch["id"])
    took = done["completed_at"] - done["created_at"]
    usage = done["usage"]
    eta = quote["estimated_completion_at"]
    est_took = None if eta is None else eta - quoted_at
    return {
        "batch_id": batch["id"],
        "quote": quote,
        "engine_seconds": {"estimated": quote["engine_seconds"], "actual": usage["engine_seconds"],
                           "error": _error(quote["engine_seconds"], usage["engine_seconds"])},
        "completion_s": {"estimated": est_took, "actual": took, "error": _error(est_took, took)},
        "output_tokens": {"expected": quote["output_tokens"]["expected"],
                          "bound": quote["output_tokens"]["bound"],
                          "actual": usage["output_tokens"],
                          "error": _error(quote["output_tokens"]["expected"],
                                          usage["output_tokens"])},
        "prompt_tokens": {"estimated": quote["prompt_tokens"], "actual": usage["input_tokens"]},
    }


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def report(rounds: list[dict[str, Any]], target: float) -> str:
    """A Markdown table of the rounds."""
    out = ["| round | history | engine-s est / actual (error) | completion s est / actual "
           "(error) | output tokens exp / actual (error) |", "|---|---|---|---|---|"]
    for i, r in enumerate(rounds, start=1):
        e, c, o = r["engine_seconds"], r["completion_s"], r["output_tokens"]
        est_c = "n/a" if c["estimated"] is None else f"{c['estimated']:.1f}"
        est_e = "n/a" if e["estimated"] is None else f"{e['estimated']:.1f}"
        out.append(f"| {i} | {r['quote']['basis']['history_jobs']} jobs | {est_e} / "
                   f"{e['actual']:.1f} ({_pct(e['error'])}) | {est_c} / {c['actual']:.1f} "
                   f"({_pct(c['error'])}) | {o['expected']} / {o['actual']} "
                   f"({_pct(o['error'])}) |")
    last = rounds[-1]
    ok = all(x is not None and abs(x) <= target
             for x in (last["engine_seconds"]["error"], last["completion_s"]["error"]))
    out.append(f"\nlast round {'within' if ok else 'OUTSIDE'} ±{100 * target:g}% "
               "(engine-seconds and completion time)")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Warm up, run the rounds, print the table; 1 when the last round misses the target."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=263, help="workload requests (all: 263)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--target", type=float, default=0.20)
    p.add_argument("--out", default=None, help="write the rounds as JSON here")
    args = p.parse_args(argv)
    with service_stack(model=args.model, workers=args.workers, beat_interval=1.0) as stack, \
            stack.client() as client:
        for _ in range(2):  # a fresh worker's first steps are not measured: two batches
            warm = create(client, upload(client, batch_file(args.warmup)))
            wait_completed(client, warm["id"])
        file_id = upload(client, batch_file(args.lines))
        rounds = []
        for i in range(args.rounds):
            rounds.append(one_round(client, file_id))
            print(f"round {i + 1}: " + json.dumps({k: rounds[-1][k] for k in (
                "engine_seconds", "completion_s", "output_tokens")}), file=sys.stderr)
    table = report(rounds, args.target)
    print(table)
    figures = {"model": args.model, "lines": args.lines, "workers": args.workers,
               "cpu": cpu_description(), "rounds": rounds}
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=1) + "\n")
    return 0 if "within" in table.splitlines()[-1] else 1


if __name__ == "__main__":
    raise SystemExit(main())
