"""The commit -> XACK window: a worker killed after its result commit and before its XACK.
Redis writes are paused (CLIENT PAUSE ... WRITE, on a Redis of the test's own) so the
writer commits a batch of results and then blocks on the ack; the worker is killed there.
The redelivered entries are acked and skipped: one result per job, no second run."""

from __future__ import annotations

import pytest

import tests.service.test_worker_failures as wf
from tests.service.helpers import batch_pending, only_lane, prompt_jobs, start_worker, wait_for
from worker.jobs.enqueue import enqueue
from worker.queue.connection import make_redis
from worker.queue.group import ensure_groups
from worker.store.crud.jobs import statuses

pytestmark = pytest.mark.services

N_JOBS = 40
FLAGS = ["--attention-backend", "torch"]  # no native kernel build: starts fast anywhere


def test_kill_between_commit_and_ack(
    migrated_pg, session_factory, keys, private_redis, tmp_path
) -> None:
    import psycopg

    with psycopg.connect(migrated_pg, autocommit=True) as conn:
        conn.execute(wf.AUDIT_SQL)
    r = make_redis(url=private_redis.url)
    ensure_groups(redis_client=r, keys=keys)
    ids = enqueue(session_factory=session_factory, redis_client=r, keys=keys,
                  jobs=prompt_jobs(N_JOBS, max_tokens=8))
    log = tmp_path / "workers.log"
    # paced steps (50 ms): work is left to commit after the pause, however fast the engine
    a = start_worker(db_url=migrated_pg, redis_url=private_redis.url, prefix=keys.prefix,
                     name="a", log_path=log, extra=FLAGS, module="tests.faults.paced_worker",
                     env={"INFLIGHT_TEST_STEP_S": "0.05"})
    try:
        wait_for(lambda: wf._counts(session_factory).get("succeeded", 0) >= 4, timeout=300,
                 what="first results", interval=0.05)
        r.execute_command("CLIENT", "PAUSE", 30_000, "WRITE")
        before = wf._counts(session_factory).get("succeeded", 0)
        wait_for(lambda: wf._counts(session_factory).get("succeeded", 0) > before, timeout=25,
                 what="a commit whose ack is blocked", interval=0.05)
        a.kill()  # SIGKILL while the XACK waits on the paused Redis
        a.wait(10)
    finally:
        r.execute_command("CLIENT", "UNPAUSE")
        if a.poll() is None:
            a.kill()
    lane = only_lane(r, keys)
    pending = r.xpending_range(lane, keys.group, min="-", max="+", count=1000)
    entry_job = {entry_id: fields["job_id"] for entry_id, fields in r.xrange(lane)}
    with session_factory() as s:
        st = statuses(session=s, job_ids=ids)
    window = [entry_job[p["message_id"]] for p in pending if st[entry_job[p["message_id"]]]
              == "succeeded"]
    assert window, "no result was committed and left unacked: the window was not hit"
    assert wf._counts(session_factory).get("succeeded", 0) < N_JOBS
    b = start_worker(db_url=migrated_pg, redis_url=private_redis.url, prefix=keys.prefix,
                     name="b", log_path=log, extra=FLAGS)
    try:
        wait_for(lambda: wf._done(session_factory, N_JOBS), timeout=300, what="all jobs to end")
        assert wf._counts(session_factory) == {"succeeded": N_JOBS}
        wait_for(lambda: batch_pending(r, keys) == 0,
                 timeout=30, what="every entry to be acked")
    finally:
        assert wf._stop(b) == 0
    wf._assert_each_result_written_once(migrated_pg, N_JOBS)
    with psycopg.connect(migrated_pg) as conn:
        rows = conn.execute("SELECT id, attempts, worker_id FROM jobs WHERE id = ANY(%s)",
                            (window,)).fetchall()
    assert all(n == 1 and w.startswith("a-") for _, n, w in rows), rows  # never ran again
    r.close()
