"""Several workers, one consumer group: three workers on one database and one Redis, one
killed with -9 mid-run. Every job ends with exactly one result; the entries were spread over
the workers and none held more than it could admit plus its prefetch."""

from __future__ import annotations

import time
from collections import Counter

import pytest

import tests.service.test_worker_failures as wf
from tests.service.conftest import REDIS_URL
from tests.service.helpers import (
    batch_pending,
    batch_pending_by_consumer,
    prompt_jobs,
    start_worker,
    wait_for,
)
from worker.jobs.enqueue import enqueue
from worker.queue.group import ensure_groups

pytestmark = pytest.mark.services

N_JOBS = 150
SLOTS, PREFETCH = 4, 4  # a worker reads what it can admit + prefetch (default 4)
FLAGS = ["--attention-backend", "torch", "--max-num-seqs", str(SLOTS)]


def _pending_per_consumer(redis_client, keys) -> dict[str, int]:
    return batch_pending_by_consumer(redis_client, keys)


def test_three_workers_one_killed(migrated_pg, session_factory, redis_client, keys, tmp_path):
    import psycopg

    with psycopg.connect(migrated_pg, autocommit=True) as conn:
        conn.execute(wf.AUDIT_SQL)
    ensure_groups(redis_client=redis_client, keys=keys)
    log = tmp_path / "workers.log"
    # Paced steps (30 ms, about a real model's) and jobs enqueued once all three run: the
    # tiny model would otherwise let the first worker up finish everything before the kill.
    workers = {
        name: start_worker(db_url=migrated_pg, redis_url=REDIS_URL, prefix=keys.prefix,
                           name=name, log_path=log, extra=FLAGS, module="tests.faults.paced_worker",
                           env={"INFLIGHT_TEST_STEP_S": "0.03"})
        for name in ("a", "b", "c")
    }
    most_held = 0
    try:
        wait_for(lambda: all(f"(consumer {n}) starting" in log.read_text() for n in workers),
                 timeout=300, what="three workers to start")
        enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys,
                jobs=prompt_jobs(N_JOBS, max_tokens=8))
        wait_for(lambda: wf._counts(session_factory).get("succeeded", 0) >= 30, timeout=300,
                 what="30 results")
        workers["a"].kill()  # SIGKILL: its held entries stay pending until taken over
        workers["a"].wait(10)
        assert wf._counts(session_factory).get("succeeded", 0) < N_JOBS, "done before the kill"
        deadline = time.monotonic() + 300
        while not wf._done(session_factory, N_JOBS):
            assert time.monotonic() < deadline, "jobs left after the kill"
            held = _pending_per_consumer(redis_client, keys)
            most_held = max([most_held, *(n for c, n in held.items() if c != "a")])
            time.sleep(0.1)
        assert wf._counts(session_factory) == {"succeeded": N_JOBS}
        wait_for(lambda: batch_pending(redis_client, keys) == 0,
                 timeout=30, what="every entry to be acked")
    finally:
        for name, proc in workers.items():
            if name == "a" or proc.poll() is not None:
                continue
            assert wf._stop(proc) == 0
    wf._assert_each_result_written_once(migrated_pg, N_JOBS)
    with psycopg.connect(migrated_pg) as conn:
        by_worker = Counter(
            w.split("-")[0] for (w,) in conn.execute("SELECT worker_id FROM jobs").fetchall()
        )
    assert set(by_worker) == {"a", "b", "c"}, by_worker  # the work was spread over all three
    # Nobody hoarded what it could not admit: a worker's pending entries are its running and
    # prefetched jobs, plus finished ones whose result commit + ack is under way and entries
    # taken over from "a" (each bounded by what it wants); never the ~100 left in the stream.
    assert most_held <= 2 * (SLOTS + PREFETCH), most_held
    assert "took over" in log.read_text()
