"""After a worker dies, its jobs come back at batch speed, and a poison job is found by
evidence (bisection over worker deaths), not by running every redelivered job alone.

Workers are real processes (``tests.faults.paced_worker``) restarted under the same consumer
name, so each start replays the pending entries its predecessor left."""

from __future__ import annotations

import signal
import statistics
import time

import psycopg
import pytest

import tests.service.test_worker_failures as wf
from tests.service.conftest import REDIS_URL
from tests.service.helpers import prompt_jobs, start_worker, wait_for
from worker.jobs.enqueue import enqueue
from worker.queue.group import ensure_groups
from worker.store.crud.jobs import get_job
from worker.store.models import Iteration
from worker.store.schemas import NewJob

pytestmark = pytest.mark.services

FAST_START = ["--attention-backend", "torch"]  # no native kernel build: starts fast anywhere


def _mean_running(session_factory, worker_id: str | None = None) -> tuple[float, int]:
    """Mean ``num_running`` over the steps of one worker (all workers: None), and the count."""
    with session_factory() as s:
        q = s.query(Iteration.num_running)
        if worker_id is not None:
            q = q.filter(Iteration.worker_id == worker_id)
        values = [r[0] for r in q.all()]
    return (statistics.fmean(values) if values else 0.0), len(values)


def _worker_ids(session_factory) -> list[str]:
    """Worker ids in the order their first step was traced."""
    with session_factory() as s:
        rows = s.query(Iteration.worker_id, Iteration.time).order_by(Iteration.time).all()
    return list(dict.fromkeys(r[0] for r in rows))


def test_a_poison_job_among_40_is_dead_lettered_alone(
    migrated_pg, session_factory, redis_client, keys, tmp_path
) -> None:
    with psycopg.connect(migrated_pg, autocommit=True) as conn:
        conn.execute(wf.AUDIT_SQL)
    ensure_groups(redis_client=redis_client, keys=keys)
    good = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys,
                   jobs=prompt_jobs(4))
    poison = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys, jobs=[
        NewJob(request={"url": "/v1/completions", "body": {"prompt": "POISON pill", "max_tokens": 4}})])
    good += enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys,
                    jobs=prompt_jobs(35, tag="late"))  # 39 good, 1 poison
    log = tmp_path / "workers.log"
    crashes = 0
    for _ in range(14):
        w = start_worker(db_url=migrated_pg, redis_url=REDIS_URL, prefix=keys.prefix, name="p",
                         log_path=log, module="tests.faults.paced_worker", extra=FAST_START,
                         env={"INFLIGHT_TEST_POISON": "POISON", "INFLIGHT_TEST_STEP_S": "0.01"})
        try:
            wait_for(lambda w=w: w.poll() is not None or wf._done(session_factory, 40), timeout=90,
                     what="a crash or the end")
            if w.poll() is None:
                break
            assert w.returncode == 17, log.read_text()[-3000:]
            crashes += 1
        finally:
            if w.poll() is None:
                assert wf._stop(w) == 0
    # two deaths in plain batches (first delivery, first replay), then one per halving of
    # the cohort (at most 12 = the engine's room: 12 -> 6 -> 3 -> 2 -> 1), never one per job
    assert 3 <= crashes <= 8, crashes
    with session_factory() as s:
        job = get_job(session=s, job_id=poison[0])
        assert job.status == "failed" and "dead-lettered" in job.error and "ran alone" in job.error
        assert all(get_job(session=s, job_id=j).status == "succeeded" for j in good)
    dead = redis_client.xrange(keys.dead)
    assert [f["job_id"] for _, f in dead] == poison
    assert "alone on" in dead[0][1]["dead_evidence"]
    wf._assert_each_result_written_once(migrated_pg, 40)
    mean, steps = _mean_running(session_factory)
    assert steps and mean > 3, (mean, steps)  # the 40 ran in batches (the engine holds 8)
    assert redis_client.hlen(keys.suspects) == 0  # every run ended; no evidence left behind


def test_two_kills_without_poison_keep_the_batch(
    migrated_pg, session_factory, redis_client, keys, tmp_path
) -> None:
    """The second kill lands while the jobs replayed after the first are running, so the
    last worker starts with a dozen entries delivered twice: suspects with no evidence."""
    ensure_groups(redis_client=redis_client, keys=keys)
    n = 60
    ids = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys,
                  jobs=prompt_jobs(n, max_tokens=16))
    log = tmp_path / "workers.log"

    def start(step_s: str):
        return start_worker(db_url=migrated_pg, redis_url=REDIS_URL, prefix=keys.prefix, name="k",
                            log_path=log, module="tests.faults.paced_worker", extra=FAST_START,
                            env={"INFLIGHT_TEST_STEP_S": step_s})

    first = start("0.03")
    try:
        wait_for(lambda: wf._counts(session_factory).get("succeeded", 0) >= 8, timeout=90,
                 what="8 results")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    second = start("0.2")  # 16 steps take 3 s: the kill below finds its replays running
    try:
        wait_for(lambda: log.read_text().count("starting") >= 2, timeout=90, what="a second start")
        time.sleep(1.0)
    finally:
        second.send_signal(signal.SIGKILL)
        second.wait(30)
    last = start("0.03")
    try:
        wait_for(lambda: wf._done(session_factory, n), timeout=120, what="all jobs to end")
    finally:
        assert wf._stop(last) == 0
    assert wf._counts(session_factory) == {"succeeded": n}
    with session_factory() as s:
        assert all(get_job(session=s, job_id=j).error is None for j in ids)
    workers = _worker_ids(session_factory)
    mean_first, _ = _mean_running(session_factory, workers[0])
    mean_last, _ = _mean_running(session_factory, workers[-1])
    assert "running a cohort of" in log.read_text()  # the last worker did meet suspects
    assert mean_last >= mean_first / 2, (mean_first, mean_last)
