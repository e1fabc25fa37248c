"""Helpers for the worker tests: job factories, waiting, worker subprocesses."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from worker.store.schemas import NewJob

ROOT = Path(__file__).resolve().parents[2]


def prompt_jobs(n: int, *, max_tokens: int = 6, cls: str = "batch", tag: str = "job") -> list[NewJob]:
    """``n`` greedy completion jobs with short outputs."""
    return [
        NewJob(
            request={
                "url": "/v1/completions",
                "body": {"prompt": f"{tag} {i}: the quick brown fox", "max_tokens": max_tokens, "temperature": 0},
            },
            queue_class=cls,
            custom_id=f"{tag}-{i}",
        )
        for i in range(n)
    ]


def batch_lanes(redis_client: Any, keys: Any) -> list[str]:
    """The batch lanes of ``keys.model`` (earliest deadline first)."""
    from worker.queue.lanes import lane_list

    return [lane for lane, _ in lane_list(redis_client=redis_client, keys=keys)]


def only_lane(redis_client: Any, keys: Any) -> str:
    """The one batch lane of ``keys.model`` (the test published its batch work in one go)."""
    lanes = batch_lanes(redis_client, keys)
    assert len(lanes) == 1, f"expected one batch lane, found {lanes}"
    return lanes[0]


def batch_pending(redis_client: Any, keys: Any) -> int:
    """Batch entries delivered and not acked, over every lane."""
    return sum(int(redis_client.xpending(lane, keys.group)["pending"])
               for lane in batch_lanes(redis_client, keys))


def batch_pending_by_consumer(redis_client: Any, keys: Any) -> dict[str, int]:
    """Batch entries delivered and not acked per consumer, over every lane."""
    out: dict[str, int] = {}
    for lane in batch_lanes(redis_client, keys):
        for c in redis_client.xpending(lane, keys.group).get("consumers") or []:
            out[c["name"]] = out.get(c["name"], 0) + int(c["pending"])
    return out


def batch_length(redis_client: Any, keys: Any) -> int:
    """Batch entries held (acked ones too, until trimmed), over every lane."""
    return sum(int(redis_client.xlen(lane)) for lane in batch_lanes(redis_client, keys))


def batch_entries(redis_client: Any, keys: Any) -> list[tuple[str, str, dict[str, str]]]:
    """``(lane, entry id, fields)`` of every batch entry held, lane by lane."""
    return [(lane, entry_id, fields) for lane in batch_lanes(redis_client, keys)
            for entry_id, fields in redis_client.xrange(lane)]


def raw_batch_entry(redis_client: Any, keys: Any, fields: dict[str, str], *,
                    due_in_s: float = 3600.0) -> tuple[str, str]:
    """XADD ``fields`` as they are (a garbled entry, say) to the lane of a deadline
    ``due_in_s`` from now, listed in the lane set as a publish would; returns (lane, id)."""
    import redis

    from worker.queue.slack import lane_end

    now = time.time()
    lane = keys.lane(lane_end(now + due_in_s, now))
    try:
        redis_client.xgroup_create(lane, keys.group, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise
    redis_client.zadd(keys.lanes, {lane: now + due_in_s}, lt=True)
    return lane, redis_client.xadd(lane, fields)


def wait_for(cond: Callable[[], bool], *, timeout: float, what: str, interval: float = 0.2) -> None:
    """Poll ``cond`` until true; fail the test with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


FAST_FLAGS = [
    "--model", "tiny-llama", "--max-num-seqs", "8", "--num-kv-blocks", "256",
    "--claim-idle-ms", "2000", "--claim-interval", "0.5", "--heartbeat-interval", "0.3",
    "--lock-ttl", "1.5", "--reconcile-interval", "1", "--reconcile-grace", "1",
    "--worker-timeout", "3", "--trim-interval", "1", "--num-threads", "1", "--log-level", "INFO",
]  # fmt: skip


def start_worker(
    *, db_url: str, redis_url: str, prefix: str, name: str, log_path: Path, extra: list[str] | None = None,
    module: str = "cli.main", env: dict[str, str] | None = None,
) -> subprocess.Popen:
    """Start ``inflight worker`` (or a test wrapper module) as a subprocess."""
    args = [sys.executable, "-m", module, "worker", "--database-url", db_url, "--redis-url", redis_url,
            "--prefix", prefix, "--name", name, *FAST_FLAGS, *(extra or [])]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    log = open(log_path, "ab")  # noqa: SIM115
    return subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=full_env)


@contextlib.contextmanager
def worker_thread(config: Any, engine_factory: Callable[[Any], Any]) -> Iterator[Any]:
    """A ``WorkerProcess`` running in a thread of this process while the block runs; stopped (and
    checked to have stopped) when it ends."""
    from worker.service.worker import WorkerProcess

    w = WorkerProcess(config, engine_factory=engine_factory, install_signals=False)
    t = threading.Thread(target=w.run)
    t.start()
    try:
        yield w
    finally:
        w.stop()
        t.join(60)
    assert not t.is_alive(), "the worker did not stop"
