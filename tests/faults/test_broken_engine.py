"""A worker whose engine fails whatever it runs is not a black hole: it stops taking work,
hands every held job back unfailed (no delivery counted against them) and exits non-zero;
a second worker finishes every job, each result written once."""

from __future__ import annotations

import pytest

import tests.service.test_worker_failures as wf
from tests.service.conftest import REDIS_URL
from tests.service.helpers import batch_pending, prompt_jobs, start_worker, wait_for
from worker.jobs.enqueue import enqueue
from worker.queue.group import ensure_groups
from worker.store.crud.jobs import list_jobs

pytestmark = pytest.mark.services

N_JOBS = 40


def test_broken_engine_hands_jobs_back_and_exits(
    migrated_pg, session_factory, redis_client, keys, tmp_path
) -> None:
    import psycopg

    with psycopg.connect(migrated_pg, autocommit=True) as conn:
        conn.execute(wf.AUDIT_SQL)
    ensure_groups(redis_client=redis_client, keys=keys)
    ids = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys,
                  jobs=prompt_jobs(N_JOBS))
    log = tmp_path / "workers.log"
    # --max-deliveries 1: a handed-back job that counted as a delivery would be dead-lettered
    # --attention-backend torch: no native kernel build, so the workers start fast anywhere
    extra = ["--max-deliveries", "1", "--attention-backend", "torch"]
    a = start_worker(db_url=migrated_pg, redis_url=REDIS_URL, prefix=keys.prefix, name="a",
                     log_path=log, module="tests.faults.broken_engine_worker", extra=extra,
                     env={"INFLIGHT_TEST_FAIL_AFTER": "12"})
    try:
        code = a.wait(180)  # it exits by itself
    finally:
        if a.poll() is None:
            a.kill()
    assert code == 3, log.read_text()[-3000:]
    counts = wf._counts(session_factory)
    assert counts.get("failed", 0) == 0 and counts.get("running", 0) == 0, counts
    assert counts.get("queued", 0) > 0, "worker a finished everything before its engine broke"
    assert "handed" in log.read_text()
    b = start_worker(db_url=migrated_pg, redis_url=REDIS_URL, prefix=keys.prefix, name="b",
                     log_path=log, extra=extra)
    try:
        wait_for(lambda: "(consumer b) starting" in log.read_text(), timeout=300,
                 what="worker b to start")
        wait_for(lambda: wf._done(session_factory, len(ids)), timeout=150, what="all jobs to end")
        assert wf._counts(session_factory) == {"succeeded": N_JOBS}
        wait_for(lambda: batch_pending(redis_client, keys) == 0,
                 timeout=20, what="every entry to be acked")
    finally:
        assert wf._stop(b) == 0
    wf._assert_each_result_written_once(migrated_pg, N_JOBS)
    with session_factory() as s:
        assert all(j.attempts == 1 for j in list_jobs(session=s, limit=1000))
