"""Backpressure instead of silent loss: when Redis refuses writes or a queue is over its
bound, the API answers 503/429 with Retry-After and writes nothing; ``inflight enqueue``
stops with a clear message (exit 75) and a re-run with the same --batch-id continues
without duplicates. Redis here is a server of the test's own (its maxmemory is changed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.faults.processes import ROOT
from tests.service.helpers import batch_entries
from worker.queue.connection import make_redis

pytestmark = pytest.mark.services

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _oom(r, on: bool) -> None:
    """maxmemory 1 byte under noeviction: Redis refuses every write (``OOM command not
    allowed``), as a full production Redis does."""
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", "1" if on else "0")


def _job_count(ctx) -> int:
    from sqlalchemy import func, select

    from worker.store.models import Job

    with ctx.session_factory() as s:
        return int(s.scalar(select(func.count()).select_from(Job).where(Job.tenant == "t-bp")))


def test_api_refuses_with_retry_after_and_writes_nothing(make_env, private_redis) -> None:
    env = make_env(redis_url=private_redis.url, max_queue_depth=3)
    h = env.auth("t-bp")
    r = make_redis(url=private_redis.url)
    _oom(r, True)
    refused = env.client.post("/v1/jobs", json=CHAT, headers=h)
    assert refused.status_code == 503, refused.text
    assert refused.headers["Retry-After"] == "5"
    assert refused.json()["error"]["code"] == "queue_unavailable"
    assert "maxmemory" in refused.json()["error"]["message"], refused.text
    assert _job_count(env.ctx) == 0  # nothing half-written
    _oom(r, False)
    for _ in range(3):
        assert env.client.post("/v1/jobs", json=CHAT, headers=h).status_code == 201
    full = env.client.post("/v1/jobs", json=CHAT, headers=h)
    assert full.status_code == 429 and full.headers["Retry-After"] == "10", full.text
    assert full.json()["error"]["code"] == "queue_full"
    assert _job_count(env.ctx) == 3 and r.xlen(env.ctx.keys.stream("interactive")) == 3
    r.close()


def _enqueue(path: Path, *, db: str, redis_url: str, prefix: str, depth: int):
    return subprocess.run(
        [sys.executable, "-m", "cli", "enqueue", str(path), "--batch-id", "b-1",
         "--max-queue-depth", str(depth), "--database-url", db, "--redis-url", redis_url,
         "--prefix", prefix, "--model", "tiny-llama"],
        cwd=ROOT, env=os.environ.copy(), capture_output=True, text=True, timeout=120,
    )


def test_enqueue_stops_clearly_and_reruns_without_duplicates(
    migrated_pg, session_factory, keys, private_redis, tmp_path
) -> None:
    from worker.store.crud.jobs import count_by_status

    src = tmp_path / "in.jsonl"
    src.write_text("".join(
        json.dumps({"custom_id": f"c-{i}", "prompt": f"p {i}", "max_tokens": 2}) + "\n"
        for i in range(10)
    ))
    r = make_redis(url=private_redis.url)
    run = lambda depth: _enqueue(src, db=migrated_pg, redis_url=private_redis.url,  # noqa: E731
                                 prefix=keys.prefix, depth=depth)

    def stored() -> int:
        with session_factory() as s:
            return sum(count_by_status(session=s).values())

    first = run(4)  # the stream takes 4 entries, then is full
    assert first.returncode == 75, first.stderr
    assert len(first.stdout.split()) == 4 and "at its bound of 4" in first.stderr
    assert "re-run the same command to continue" in first.stderr
    assert stored() == 4
    _oom(r, True)
    second = run(0)  # no bound now, but Redis refuses writes
    assert second.returncode == 75 and "refuses writes" in second.stderr, second.stderr
    assert second.stdout == "" and stored() == 4  # nothing half-written
    _oom(r, False)
    third = run(0)
    assert third.returncode == 0, third.stderr
    assert len(third.stdout.split()) == 6 and stored() == 10
    assert set(first.stdout.split()).isdisjoint(third.stdout.split())
    published = Counter(f["job_id"] for _, _, f in batch_entries(r, keys))
    assert len(published) == 10 and max(published.values()) == 1  # no duplicates
    assert run(0).stdout == ""  # a fourth run finds everything enqueued
    r.close()


def test_a_redis_failure_is_refused_without_its_address() -> None:
    import redis

    from worker.queue.admission import redis_refusal

    down = redis_refusal(redis.ConnectionError("Error 111 connecting to 10.1.2.3:6379. Refused."))
    assert not down.full and down.retry_after > 0
    assert "10.1.2.3" not in str(down) and "ConnectionError" in str(down)
    oom = redis_refusal(redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'."))
    assert "refuses writes" in str(oom) and "maxmemory" in str(oom)
