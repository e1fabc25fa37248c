"""Usage from the traces, checked against the clock: the engine-seconds of every job of a
run add up to the time the worker was busy.

    .venv/bin/python benchmarks/engine_seconds.py [--lines 263] [--model smollm2-135m]

A throwaway service (``benchmarks/service_stack.py``: its own PostgreSQL database, Redis
prefix, ``inflight api`` and one ``inflight worker``) runs the first ``--lines`` of the
chat workload as one batch, after an unrecorded warm-up batch. Three figures, all from the
store:

- **engine-seconds**: the sum of ``jobs.engine_seconds`` over the batch's jobs (each job's
  share of every step it computed in, ``worker/engine/step_cost.py``);
- **step time**: the sum of the ``iterations`` rows' schedule + forward + sample time of
  the worker's steps in the run (what the shares split: equal to the above by
  construction, a check of the bookkeeping, not of the clock);
- **busy time**: the wall time the worker held at least one of the batch's jobs, the
  union of the jobs' [started_at, finished_at] (first scheduled to done, the engine's own
  timestamps), which also counts everything the loop does between steps (admitting and
  tokenizing jobs, handing results to the writer).

It passes when engine-seconds are within ``--tolerance`` (2%) of busy time. Not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.chat_batches import batch_file, create, upload, wait_completed
from benchmarks.service_stack import service_stack
from cli.bench.machine import cpu_description
from worker.store.db import make_engine


def busy_seconds(intervals: list[tuple[datetime, datetime]]) -> float:
    """The length of the union of the intervals."""
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += (b - a).total_seconds()
            end = b
        elif b > end:
            total += (b - end).total_seconds()
            end = b
    return total


def measure(database_url: str, batch_id: str) -> dict[str, Any]:
    """The three figures of one finished batch (see the module docstring)."""
    engine = make_engine(url=database_url)
    try:
        with engine.connect() as conn:
            jobs = conn.execute(text(
                "SELECT started_at, finished_at, engine_seconds, worker_id, first_step, "
                "last_step FROM jobs WHERE batch_id = :id"), {"id": batch_id}).all()
            worker = jobs[0].worker_id
            first = min(j.first_step for j in jobs)
            last = max(j.last_step for j in jobs)
            steps = conn.execute(text(
                "SELECT count(*), sum(schedule_ms + forward_ms + sample_ms) / 1000.0 "
                "FROM iterations WHERE worker_id = :w AND step BETWEEN :a AND :b "
                "AND num_prefill_tokens + num_decode_tokens > 0"),
                {"w": worker, "a": first, "b": last}).one()
    finally:
        engine.dispose()
    engine_s = sum(j.engine_seconds or 0.0 for j in jobs)
    busy = busy_seconds([(j.started_at, j.finished_at) for j in jobs])
    return {"jobs": len(jobs), "workers": len({j.worker_id for j in jobs}),
            "engine_seconds": engine_s, "step_seconds": float(steps[1] or 0.0),
            "steps": int(steps[0]), "busy_seconds": busy,
            "error": engine_s / busy - 1.0 if busy else None}


def main(argv: list[str] | None = None) -> int:
    """Run the warm-up and the measured batch; print the figures; 1 past the tolerance."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=263, help="workload requests in the batch (all: 263)")
    p.add_argument("--warmup", type=int, default=20, help="lines of the unrecorded warm-up")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--tolerance", type=float, default=0.02)
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    args = p.parse_args(argv)
    with service_stack(model=args.model, workers=1, beat_interval=1.0) as stack, \
            stack.client() as client:
        warm = create(client, upload(client, batch_file(args.warmup)))
        wait_completed(client, warm["id"])
        batch = create(client, upload(client, batch_file(args.lines)))
        wait_completed(client, batch["id"])
        figures = measure(stack.database_url, batch["id"])
    figures |= {"model": args.model, "lines": args.lines, "cpu": cpu_description()}
    print(json.dumps(figures, indent=1, default=str))
    ok = figures["error"] is not None and abs(figures["error"]) <= args.tolerance
    print(f"engine-seconds {figures['engine_seconds']:.2f} s vs busy {figures['busy_seconds']:.2f} s"
          f" ({100 * (figures['error'] or 0):+.2f}%), step time {figures['step_seconds']:.2f} s"
          f" over {figures['steps']} steps: {'within' if ok else 'OUTSIDE'} "
          f"±{100 * args.tolerance:g}%")
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=1, default=str) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
