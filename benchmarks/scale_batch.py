"""A dataset batch through the REST API and two workers as the file grows: upload,
expansion, the run, finalize and the output download, with the API's memory.

    .venv/bin/python benchmarks/scale_batch.py [--sizes 1000,5000,20000] [--workers 2]
        [--model tiny-llama] [--out docs/bench_scale_batch.json]

It starts a throwaway service (its own PostgreSQL database and Redis prefix, ``inflight
api`` in embedded mode with a 1 s beat, ``--workers`` ``inflight worker`` processes on
``--model``), runs one unrecorded 200-line warm-up batch, then for each size uploads an
OpenAI Batch file of that many completion lines, creates the batch, polls it until it is
completed as a client would, and downloads the output file. Stage times come from the
stored timestamps (``jobs.queued_at`` of the last job for expansion, ``jobs.finished_at``
of the last job for the run, the batch's ``finalizing_at`` and ``completed_at`` for
finalize). The API's resident memory is
sampled every 0.2 s. Not a test: it prints a Markdown table and a fitted slope per stage.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from benchmarks.service_stack import ServiceStack, service_stack
from cli.bench.linear_fit import fit_line
from cli.bench.machine import RssSampler, cpu_description
from worker.store.db import make_engine

STAGES = ("upload_s", "expansion_s", "run_s", "finalize_s", "download_s")


def input_file(count: int, lengths: list[int]) -> bytes:
    """``count`` completion lines, greedy, ``ignore_eos``, output lengths cycled."""
    lines = []
    for i in range(count):
        body = {"prompt": f"Item {i}: name one colour and one fruit.",
                "max_tokens": lengths[i % len(lengths)], "temperature": 0, "ignore_eos": True}
        lines.append(json.dumps({"custom_id": f"line-{i}", "method": "POST",
                                 "url": "/v1/completions", "body": body}))
    return ("\n".join(lines) + "\n").encode()


def run_batch(stack: ServiceStack, client: httpx.Client, size: int,
              lengths: list[int]) -> dict[str, Any]:
    """One batch of ``size`` lines, start to downloaded output; its figures."""
    data = input_file(size, lengths)
    with RssSampler(interval=0.2, pid=stack.api.pid) as api_rss:
        started = time.perf_counter()
        file = client.post("/v1/files", data={"purpose": "batch"},
                           files={"file": ("input.jsonl", data, "application/jsonl")})
        file.raise_for_status()
        upload_s = time.perf_counter() - started
        batch = client.post("/v1/batches", json={"input_file_id": file.json()["id"],
                                                 "endpoint": "/v1/completions",
                                                 "completion_window": "24h"})
        batch.raise_for_status()
        batch_id = batch.json()["id"]
        done = _poll_until_completed(client, batch_id, timeout=1800)
        started = time.perf_counter()
        with client.stream("GET", f"/v1/files/{done['output_file_id']}/content") as resp:
            out_lines = sum(chunk.count(b"\n") for chunk in resp.iter_bytes())
        download_s = time.perf_counter() - started
    if out_lines != size or done["request_counts"]["completed"] != size:
        raise RuntimeError(f"{size} lines in, {out_lines} out, counts {done['request_counts']}")
    stored = _stored_times(stack.database_url, batch_id)
    return {"lines": size, "upload_s": upload_s, "download_s": download_s, **stored,
            "api_peak_rss": api_rss.peak, "api_rss_start": api_rss.series[0][1]}


def _poll_until_completed(client: httpx.Client, batch_id: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = client.get(f"/v1/batches/{batch_id}").json()
        if view["status"] == "completed":
            return view
        if view["status"] in ("failed", "expired", "cancelled"):
            raise RuntimeError(f"batch {batch_id} ended {view['status']}: {view['errors']}")
        time.sleep(0.5)
    raise RuntimeError(f"batch {batch_id} not completed in {timeout:.0f}s")


def _stored_times(database_url: str, batch_id: str) -> dict[str, float]:
    """Stage durations from the stored timestamps of the batch and its jobs."""
    engine = make_engine(url=database_url)
    try:
        with engine.connect() as conn:
            b = conn.execute(text("SELECT created_at, finalizing_at, completed_at FROM batches "
                                  "WHERE id = :id"), {"id": batch_id}).one()
            j = conn.execute(text("SELECT max(queued_at), max(finished_at), min(started_at) "
                                  "FROM jobs WHERE batch_id = :id"), {"id": batch_id}).one()
            waits = [row[0] for row in conn.execute(text(
                "SELECT EXTRACT(EPOCH FROM started_at - queued_at) FROM jobs "
                "WHERE batch_id = :id"), {"id": batch_id})]
    finally:
        engine.dispose()
    return {"expansion_s": (j[0] - b.created_at).total_seconds(),
            "run_s": (j[1] - b.created_at).total_seconds(),
            "first_start_s": (j[2] - b.created_at).total_seconds(),
            "finalize_s": (b.completed_at - b.finalizing_at).total_seconds(),
            "finalize_latency_s": (b.completed_at - j[1]).total_seconds(),
            "median_queue_wait_s": float(statistics.median(waits))}


def report(rows: list[dict[str, Any]], cpu: dict[str, Any], workers: int) -> str:
    """The Markdown table, one fit per stage and the machine line."""
    mb = 1 / 2**20
    out = ["| lines | upload s | expansion s | run s (jobs/s) | finalize s | download s | "
           "API RSS MB start / peak |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['lines']:,} | {r['upload_s']:.2f} | {r['expansion_s']:.2f} | "
                   f"{r['run_s']:.1f} ({r['lines'] / r['run_s']:.0f}) | {r['finalize_s']:.2f} | "
                   f"{r['download_s']:.2f} | {r['api_rss_start'] * mb:.0f} / "
                   f"{r['api_peak_rss'] * mb:.0f} |")
    out += ["", "| stage | slope, s per 1,000 lines | intercept s | worst point / fit | "
            "marginal cost, last interval / first |", "|---|---|---|---|---|"]
    sizes = [r["lines"] for r in rows]
    for stage in STAGES:
        fit = fit_line(sizes, [r[stage] for r in rows])
        out.append(f"| {stage.removesuffix('_s')} | {fit.slope * 1000:.3f} | "
                   f"{fit.intercept:.2f} | {fit.worst_ratio:.3f} | {fit.marginal_growth:.3f} |")
    out.append("")
    out.append(f"{workers} workers. CPU: {cpu['model']} ({', '.join(cpu['vector_extensions'])})")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Start the stack, run every size, print the table and write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1000,5000,20000")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--lengths", default="2,4,8,4", help="max_tokens, cycled over the lines")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    args = p.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    worker_args = ("--num-threads", "1", "--max-num-seqs", "128")
    rows = []
    with service_stack(model=args.model, workers=args.workers, beat_interval=1.0,
                       worker_args=worker_args) as stack, stack.client() as client:
        run_batch(stack, client, 200, lengths)  # warm-up: model loads, first steps, caches
        for size in (int(x) for x in args.sizes.split(",")):
            rows.append(run_batch(stack, client, size, lengths))
            print(f"{size} lines: " + ", ".join(f"{k} {rows[-1][k]:.2f}" for k in STAGES),
                  file=sys.stderr)
    cpu = cpu_description()
    print(report(rows, cpu, args.workers))
    if args.out:
        Path(args.out).write_text(json.dumps({"model": args.model, "workers": args.workers,
                                              "lengths": lengths, "cpu": cpu, "rows": rows},
                                             indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
