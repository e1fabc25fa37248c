"""The batch side of ``benchmarks/mixed_load.py``: creating the backlog, the windows it is
measured in, its tokens/s from the worker's step traces, and the control run.

The control run is the counterfactual of the window with traffic: the same batch, alone,
on the same timeline (measured from the moment each batch's warm-up ended), under a tenant
of its own, whose salt keeps the prefix cache from serving it the mixed run's blocks. What
the batch alone runs at drifts for minutes while its running sequences' contexts grow and
fewer of them fit the KV pool; the control run drifts the same way, so the batch's share
compares like with like.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
from sqlalchemy import text

from benchmarks.stream_timing import StreamTiming
from worker.store.db import make_engine


@dataclass
class Window:
    """A measured stretch of the run (``time.time()`` seconds)."""

    start: float
    end: float

    @property
    def seconds(self) -> float:
        """Its length."""
        return self.end - self.start


def create_batch(client: httpx.Client, data: bytes) -> str:
    """Upload the file and create the batch; its id."""
    file = client.post("/v1/files", data={"purpose": "batch"},
                       files={"file": ("mixed.jsonl", data, "application/jsonl")})
    file.raise_for_status()
    batch = client.post("/v1/batches", json={"input_file_id": file.json()["id"],
                                             "endpoint": "/v1/chat/completions",
                                             "completion_window": "24h"})
    if batch.is_error:
        raise RuntimeError(f"POST /v1/batches: {batch.status_code} {batch.text}")
    return str(batch.json()["id"])


def wait_batch_running(db_url: str, batch_id: str, lines: int, warmup: float,
                       timeout: float = 600.0) -> float:
    """Wait until every line is queued and the worker stepped ``warmup`` seconds since the
    batch's first job started; the time it did."""
    engine = make_engine(url=db_url)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                queued, started = conn.execute(text(
                    "SELECT count(*), min(started_at) FROM jobs WHERE batch_id = :id"),
                    {"id": batch_id}).one()
            if queued >= lines and started is not None:
                ready = started.timestamp() + warmup
                time.sleep(max(0.0, ready - time.time()))
                return time.time()
            time.sleep(0.2)
    finally:
        engine.dispose()
    raise RuntimeError(f"batch {batch_id} did not start within {timeout:.0f}s")


def steps_in(db_url: str, window: Window) -> list[tuple[float, int, int, float]]:
    """(time, decode rows, running sequences, step ms) of the worker's steps in ``window``."""
    engine = make_engine(url=db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT time, num_decode_tokens, num_running, schedule_ms + forward_ms + "
                "sample_ms FROM iterations WHERE time >= to_timestamp(:a) AND time < "
                "to_timestamp(:b) ORDER BY time"), {"a": window.start, "b": window.end}).all()
    finally:
        engine.dispose()
    return [(r[0].timestamp(), int(r[1]), int(r[2]), float(r[3])) for r in rows]


def batch_window(db_url: str, window: Window, interactive: list[StreamTiming]) -> dict[str, Any]:
    """The batch's decode tokens/s in ``window`` (its steps' decode rows less the
    interactive requests' own), the mean occupancy and step time there."""
    steps = steps_in(db_url, window)
    rows = sum(s[1] for s in steps)
    theirs = sum(max(0, t.completion_tokens - 1) for t in interactive)
    return {"seconds": window.seconds, "steps": len(steps),
            "batch_decode_tokens": rows - theirs, "interactive_decode_tokens": theirs,
            "batch_tokens_per_s": (rows - theirs) / window.seconds,
            "mean_running": float(np.mean([s[2] for s in steps])) if steps else 0.0,
            "mean_step_ms": float(np.mean([s[3] for s in steps])) if steps else 0.0}


def batch_backlog(db_url: str, batch_id: str) -> int:
    """How many of the batch's jobs are still queued."""
    engine = make_engine(url=db_url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(
                "SELECT count(*) FROM jobs WHERE batch_id = :id AND status = 'queued'"),
                {"id": batch_id}).scalar_one())
    finally:
        engine.dispose()


def wait_traces(db_url: str, after: float, timeout: float = 30.0) -> None:
    """Wait until the worker committed a step trace later than ``after`` (traces are
    flushed about once a second), so a window's steps are all in SQL."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if steps_in(db_url, Window(after, after + 3600)):
            return
        time.sleep(0.5)


def wait_batch_done(client: httpx.Client, batch_id: str, timeout: float = 7200.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.get(f"/v1/batches/{batch_id}").json()["status"] in (
                "completed", "failed", "expired", "cancelled"):
            return
        time.sleep(1.0)
    raise RuntimeError(f"batch {batch_id} did not end within {timeout:.0f}s")



def shifted(window: Window, origin: float, to: float) -> Window:
    """``window`` moved from a timeline that starts at ``origin`` to one that starts at ``to``."""
    return Window(to + window.start - origin, to + window.end - origin)


def control_run(client: httpx.Client, db_url: str, data: bytes, lines: int, warmup: float,
                span: float, sample: Callable[[], dict[str, float]],
                marks: tuple[float, ...]) -> tuple[float, list[dict[str, float]]]:
    """The batch of ``data`` alone (``client`` is another tenant's), from the end of its
    ``warmup`` for ``span`` seconds, then cancelled; when its warm-up ended, and what
    ``sample`` returned ``marks`` seconds after that (each at most ``span``)."""
    batch_id = create_batch(client, data)
    ready = wait_batch_running(db_url, batch_id, lines, warmup)
    samples = []
    for mark in marks:
        time.sleep(max(0.0, ready + mark - time.time()))
        samples.append(sample())
    time.sleep(max(0.0, ready + span - time.time()))
    if not batch_backlog(db_url, batch_id):
        print("the control run's backlog ran out: raise --batch-lines", file=sys.stderr)
    wait_traces(db_url, ready + span)
    client.post(f"/v1/batches/{batch_id}/cancel")
    wait_batch_done(client, batch_id)
    return ready, samples
