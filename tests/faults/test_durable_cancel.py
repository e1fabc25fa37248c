"""Cancellation is durable: the cancel request is recorded in SQL; Redis only carries the
signal. A worker honours a recorded cancel whose Redis signal was lost, both for a job it
runs and for a job it (re)reads after the worker that ran it died."""

from __future__ import annotations

import threading

import pytest

from tests.faults.engines import paced_tiny
from tests.service.conftest import REDIS_URL
from tests.service.helpers import wait_for
from worker.jobs.cancel import request_cancel
from worker.jobs.enqueue import enqueue
from worker.service.config import WorkerConfig
from worker.service.worker import WorkerProcess
from worker.store.crud.job_status import cancel_job, start_jobs
from worker.store.crud.jobs import get_job
from worker.store.schemas import NewJob

pytestmark = pytest.mark.services

LONG = NewJob(
    request={"url": "/v1/completions",
             "body": {"prompt": "go", "max_tokens": 240, "ignore_eos": True, "temperature": 0}},
    queue_class="interactive",
)


def _config(db: str, prefix: str) -> WorkerConfig:
    return WorkerConfig(
        database_url=db, redis_url=REDIS_URL, model="tiny-llama", prefix=prefix, name="cancel",
        heartbeat_interval=0.3, cancel_poll_interval=0.05, reconcile_interval=3600,
        write_traces=False,
    )


def _job(session_factory, job_id: str):
    with session_factory() as s:
        return get_job(session=s, job_id=job_id)


def _run_worker(config: WorkerConfig) -> tuple[WorkerProcess, threading.Thread]:
    w = WorkerProcess(config, engine_factory=paced_tiny, install_signals=False)
    t = threading.Thread(target=w.run)
    t.start()
    wait_for(lambda: w.loop is not None, timeout=180, what="the engine to load")
    return w, t


def test_cancel_recorded_while_its_worker_died_is_honoured_on_reread(
    migrated_pg, session_factory, redis_client, keys
) -> None:
    (job_id,) = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys,
                        jobs=[LONG])
    with session_factory.begin() as s:  # a worker took it, then died
        start_jobs(session=s, job_ids=[job_id], worker_id="dead-worker")
    status = request_cancel(session_factory=session_factory, redis_client=redis_client,
                            keys=keys, job_id=job_id)
    assert status == "running" and redis_client.sismember(keys.cancels, job_id)
    redis_client.delete(keys.cancels)  # Redis restarted without persistence: signal lost
    w, t = _run_worker(_config(migrated_pg, keys.prefix))
    try:
        wait_for(lambda: _job(session_factory, job_id).status != "running", timeout=60,
                 what="the job to end")
        wait_for(lambda: redis_client.xpending(keys.stream("interactive"), keys.group)["pending"]
                 == 0, timeout=20, what="the entry to be acked")
    finally:
        w.stop()
        t.join(60)
    job = _job(session_factory, job_id)
    assert job.status == "cancelled" and job.completion_tokens is None  # it never ran again
    assert job.attempts == 1 and job.cancel_requested_at is not None


def test_cancel_whose_signal_was_lost_stops_a_running_job(
    migrated_pg, session_factory, redis_client, keys
) -> None:
    w, t = _run_worker(_config(migrated_pg, keys.prefix))
    try:
        (job_id,) = enqueue(session_factory=session_factory, redis_client=redis_client,
                            keys=keys, jobs=[LONG])
        wait_for(lambda: _job(session_factory, job_id).status == "running", timeout=60,
                 what="the job to start", interval=0.02)
        with session_factory.begin() as s:  # recorded in SQL; the Redis signal never arrives
            assert cancel_job(session=s, job_id=job_id) == "running"
        wait_for(lambda: _job(session_factory, job_id).status != "running", timeout=30,
                 what="the job to end")
    finally:
        w.stop()
        t.join(60)
    job = _job(session_factory, job_id)
    assert job.status == "cancelled" and (job.completion_tokens or 0) < 240
