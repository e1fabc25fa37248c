"""Worker processes against the real Redis and PostgreSQL: kill -9, a poison job, Redis
losing its data, PostgreSQL unreachable, SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter

import psycopg
import pytest

from tests.service.conftest import REDIS_URL, delete_prefix
from tests.service.helpers import batch_lanes, batch_pending, prompt_jobs, start_worker, wait_for
from tests.service.tcp_proxy import TcpProxy
from worker.jobs.enqueue import enqueue
from worker.queue.group import ensure_groups
from worker.store.crud.jobs import count_by_status, get_job
from worker.store.job_lifecycle import is_allowed
from worker.store.schemas import NewJob

pytestmark = pytest.mark.services

AUDIT_SQL = """
CREATE TABLE job_audit (job_id text, old_status text, new_status text, at timestamptz DEFAULT now());
CREATE FUNCTION job_audit_fn() RETURNS trigger AS $$
BEGIN
  IF OLD.status IN ('succeeded', 'failed', 'cancelled')
     OR NEW.status IN ('succeeded', 'failed', 'cancelled') THEN
    INSERT INTO job_audit (job_id, old_status, new_status) VALUES (NEW.id, OLD.status, NEW.status);
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER job_audit AFTER UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION job_audit_fn();
CREATE TABLE job_moves (job_id text, old_status text, new_status text);
CREATE FUNCTION job_moves_fn() RETURNS trigger AS $$
BEGIN
  IF OLD.status IS DISTINCT FROM NEW.status THEN
    INSERT INTO job_moves (job_id, old_status, new_status) VALUES (NEW.id, OLD.status, NEW.status);
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER job_moves AFTER UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION job_moves_fn();
"""


# Steps paced at 20 ms, so what a test does "mid-run" lands mid-run on a fast machine too.
PACED = {"module": "tests.faults.paced_worker", "env": {"INFLIGHT_TEST_STEP_S": "0.02"}}


DRAIN_STARTED = "draining: intake stopped"  # the worker's log line as a drain begins


def _counts(session_factory) -> dict[str, int]:
    with session_factory() as s:
        return count_by_status(session=s)


def _done(session_factory, n: int) -> bool:
    c = _counts(session_factory)
    return sum(c.get(k, 0) for k in ("succeeded", "failed", "cancelled")) >= n


def _stop(proc: subprocess.Popen, timeout: float = 60) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout)


def _assert_each_result_written_once(pg_url: str, n: int) -> None:
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute("SELECT job_id, old_status, new_status FROM job_audit").fetchall()
    assert not [r for r in rows if r[1] in ("succeeded", "failed", "cancelled")], "a result was overwritten"
    per_job = Counter(r[0] for r in rows)
    assert len(per_job) == n and set(per_job.values()) == {1}, "some job got more than one result"
    with psycopg.connect(pg_url) as conn:
        moves = conn.execute("SELECT DISTINCT old_status, new_status FROM job_moves").fetchall()
    assert moves and all(is_allowed(a, b) for a, b in moves), f"moves outside the table: {moves}"


def test_kill9_mid_run_then_new_worker(migrated_pg, session_factory, redis_client, keys, tmp_path) -> None:
    with psycopg.connect(migrated_pg, autocommit=True) as conn:
        conn.execute(AUDIT_SQL)
    ensure_groups(redis_client=redis_client, keys=keys)
    ids = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys, jobs=prompt_jobs(200))
    log = tmp_path / "workers.log"
    a = start_worker(db_url=migrated_pg, redis_url=REDIS_URL, prefix=keys.prefix, name="a", log_path=log,
                     **PACED)
    try:
        wait_for(lambda: _counts(session_factory).get("succeeded", 0) >= 40, timeout=90, what="40 results from worker a")
        a.kill()  # SIGKILL: no drain, no ack of in-flight work
        a.wait(10)
        assert _counts(session_factory).get("succeeded", 0) < 200, "worker a finished everything before the kill"
        b = start_worker(db_url=migrated_pg, redis_url=REDIS_URL, prefix=keys.prefix, name="b", log_path=log)
        try:
            wait_for(lambda: _done(session_factory, len(ids)), timeout=150, what="all 200 jobs to end")
            assert _counts(session_factory) == {"succeeded": 200}
            wait_for(lambda: batch_pending(redis_client, keys) == 0,
                     timeout=20, what="every entry to be acked")
        finally:
            assert _stop(b) == 0
    finally:
        if a.poll() is None:
            a.kill()
    _assert_each_result_written_once(migrated_pg, 200)
    assert "took over" in log.read_text()


def test_redis_flushed_mid_run(migrated_pg, session_factory, redis_client, keys, tmp_path) -> None:
    with psycopg.connect(migrated_pg, autocommit=True) as conn:
        conn.execute(AUDIT_SQL)
    ensure_groups(redis_client=redis_client, keys=keys)
    ids = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys, jobs=prompt_jobs(120, max_tokens=8))
    w = start_worker(db_url=migrated_pg, redis_url=REDIS_URL, prefix=keys.prefix, name="f", log_path=tmp_path / "w.log",
                     **PACED)
    try:
        wait_for(lambda: _counts(session_factory).get("succeeded", 0) >= 10, timeout=90, what="first results")
        delete_prefix(redis_client, keys.prefix)  # Redis lost everything (streams, group, locks)
        left = 120 - _counts(session_factory).get("succeeded", 0)
        assert left > 20
        wait_for(lambda: _done(session_factory, len(ids)), timeout=120, what="all jobs to end after the flush")
        assert _counts(session_factory) == {"succeeded": 120}
    finally:
        assert _stop(w) == 0
    assert "reconciler re-published" in (tmp_path / "w.log").read_text()
    _assert_each_result_written_once(migrated_pg, 120)


def _acked_job_ids(redis_client, keys) -> set[str]:
    out: set[str] = set()
    for stream in batch_lanes(redis_client, keys):
        entries = redis_client.xrange(stream)
        (group,) = redis_client.xinfo_groups(stream)
        last = tuple(int(x) for x in group["last-delivered-id"].split("-"))
        pending = {r["message_id"] for r in redis_client.xpending_range(stream, keys.group, "-", "+", 100_000)}
        out |= {f["job_id"] for eid, f in entries
                if tuple(int(x) for x in eid.split("-")) <= last and eid not in pending}
    return out


def test_postgres_unreachable_for_a_few_seconds(migrated_pg, session_factory, redis_client, keys, tmp_path) -> None:
    ensure_groups(redis_client=redis_client, keys=keys)
    ids = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys, jobs=prompt_jobs(100, max_tokens=48))
    proxy = TcpProxy(5432)
    via_proxy = migrated_pg.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
    w = start_worker(db_url=via_proxy, redis_url=REDIS_URL, prefix=keys.prefix, name="pg", log_path=tmp_path / "w.log",
                     extra=["--trim-interval", "3600"])
    try:
        wait_for(lambda: _counts(session_factory).get("succeeded", 0) >= 10, timeout=90, what="first results")
        proxy.cut()
        checks = 0
        t_end = time.monotonic() + 4
        while time.monotonic() < t_end:
            acked = _acked_job_ids(redis_client, keys)  # Redis first, then SQL (direct, not cut)
            with psycopg.connect(migrated_pg) as conn:
                rows = conn.execute("SELECT id FROM jobs WHERE status = 'succeeded'").fetchall()
            assert acked <= {r[0] for r in rows}, "a job was acked before its result was written"
            checks += 1
            time.sleep(0.2)
        assert w.poll() is None, "the worker died during the outage"
        proxy.restore()
        wait_for(lambda: _done(session_factory, len(ids)), timeout=120, what="all jobs to end after the outage")
        assert _counts(session_factory) == {"succeeded": 100}
        assert _acked_job_ids(redis_client, keys) == set(ids)
        assert checks >= 5
    finally:
        proxy.restore()
        assert _stop(w) == 0
        proxy.close()
    assert "retrying" in (tmp_path / "w.log").read_text()


def test_sigterm_drains_and_second_signal_stops_at_once(migrated_pg, session_factory, redis_client, keys, tmp_path) -> None:
    ensure_groups(redis_client=redis_client, keys=keys)
    ids = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys, jobs=prompt_jobs(24, max_tokens=160))
    log = tmp_path / "w.log"
    # four slots: at SIGTERM most jobs are still queued or buffered, and are handed back
    w = start_worker(db_url=migrated_pg, redis_url=REDIS_URL, prefix=keys.prefix, name="d", log_path=log,
                     extra=["--max-num-seqs", "4"])
    wait_for(lambda: _counts(session_factory).get("succeeded", 0) >= 3, timeout=90, what="first results")
    t0 = time.monotonic()
    w.send_signal(signal.SIGTERM)
    assert w.wait(60) == 0
    assert time.monotonic() - t0 < 30
    counts = _counts(session_factory)
    assert counts.get("running", 0) == 0  # in-flight work finished or was handed back
    assert counts.get("succeeded", 0) < 24 and sum(counts.values()) == 24
    # what the drain did not finish was re-published as fresh entries: nothing stays pending
    # with a delivery counted against it
    assert batch_pending(redis_client, keys) == 0
    # a new worker reads the re-published entries and finishes the rest
    w2 = start_worker(db_url=migrated_pg, redis_url=REDIS_URL, prefix=keys.prefix, name="d", log_path=log)
    try:
        wait_for(lambda: _done(session_factory, len(ids)), timeout=90, what="the rest to finish")
        assert _counts(session_factory) == {"succeeded": 24}
        # second signal during a drain: stop at once, without waiting for the long jobs
        long = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys,
                       jobs=[NewJob(request={"url": "/v1/completions", "body": {"prompt": "go", "max_tokens": 900, "ignore_eos": True}})
                             for _ in range(4)])
        wait_for(lambda: _counts(session_factory).get("running", 0) >= 4, timeout=30, what="long jobs to start")
        drains = log.read_text().count(DRAIN_STARTED)
        w2.send_signal(signal.SIGTERM)
        # the second signal as soon as the drain has begun: on a fast core the tiny model's
        # 900 tokens take under a second, so a fixed pause could outlast the jobs
        wait_for(lambda: log.read_text().count(DRAIN_STARTED) > drains, timeout=10,
                 what="the drain to begin")
        t0 = time.monotonic()
        w2.send_signal(signal.SIGTERM)
        assert w2.wait(30) == 1
        assert time.monotonic() - t0 < 10
        # the long jobs still unfinished stay delivered and unacked, for another worker to
        # claim; on a fast core the first to start may finish before the second signal
        with session_factory() as s:
            unfinished = [j for j in long if get_job(session=s, job_id=j).status != "succeeded"]
        assert unfinished, "every long job finished: the second signal stopped nothing"
        assert batch_pending(redis_client, keys) == len(unfinished)
    finally:
        if w2.poll() is None:
            w2.kill()
