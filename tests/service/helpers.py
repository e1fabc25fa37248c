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
