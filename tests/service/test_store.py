"""Repository functions against a real PostgreSQL database (and SQLite where it differs)."""

from __future__ import annotations

import pytest

from worker.store.base import utcnow
from worker.store.crud.batches import create_batch, refresh_request_counts
from worker.store.crud.iterations import batch_mates, insert_iterations, iterations_of_job
from worker.store.crud.jobs import (
    cancel_job,
    count_by_status,
    create_jobs,
    finish_jobs,
    get_job,
    list_jobs,
    requeue_jobs,
    start_jobs,
)
from worker.store.db import make_engine, make_session_factory
from worker.store.schemas import JobResult, NewJob

pytestmark = pytest.mark.services


def _jobs(n: int, **kw) -> list[NewJob]:
    return [NewJob(request={"url": "/v1/completions", "body": {"prompt": f"p{i}"}}, **kw) for i in range(n)]


def _step_row(worker: str, step: int) -> dict:
    return dict(
        worker_id=worker, step=step, time=utcnow(), num_running=2, num_waiting=0,
        num_prefill_tokens=10, num_decode_tokens=2, kv_blocks_used=3, kv_blocks_total=64,
        num_preemptions=0, num_admitted=1, num_finished=0, schedule_ms=0.1, forward_ms=1.0,
        sample_ms=0.1,
    )


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_job_lifecycle_is_idempotent(backend: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("migrated_sqlite" if backend == "sqlite" else "migrated_pg")
    engine = make_engine(url=url)
    sf = make_session_factory(engine=engine)
    with sf.begin() as s:
        ids = create_jobs(session=s, jobs=_jobs(3, tenant="t1"))
    with sf.begin() as s:
        assert start_jobs(session=s, job_ids=[*ids, "job_missing"], worker_id="w1") == set(ids)
    first = JobResult(job_id=ids[0], status="succeeded", text="hello", finish_reason="length",
                      prompt_tokens=2, completion_tokens=5, first_step=3, last_step=7)
    with sf.begin() as s:
        finish_jobs(session=s, results=[first], worker_id="w1")
    with sf.begin() as s:  # a second result for the same job is ignored
        finish_jobs(session=s, results=[JobResult(job_id=ids[0], status="failed", error="late")])
        assert start_jobs(session=s, job_ids=[ids[0]], worker_id="w2") == set()
    with sf() as s:
        job = get_job(session=s, job_id=ids[0])
        assert job is not None
        assert (job.status, job.text, job.error, job.attempts) == ("succeeded", "hello", None, 1)
        assert job.finished_at is not None and job.finished_at.tzinfo is not None
        assert count_by_status(session=s) == {"succeeded": 1, "running": 2}
        assert [j.id for j in list_jobs(session=s, status="running")] == sorted(ids[1:])
    with sf.begin() as s:
        assert requeue_jobs(session=s, job_ids=[ids[1]], worker_id="w1") == 1
        assert cancel_job(session=s, job_id=ids[1]) == "cancelled"
        assert cancel_job(session=s, job_id=ids[2]) == "running"
        assert cancel_job(session=s, job_id="nope") is None
    engine.dispose()


def test_batch_mates_and_iterations(session_factory) -> None:
    with session_factory.begin() as s:
        a, b, c = create_jobs(session=s, jobs=_jobs(3))
        start_jobs(session=s, job_ids=[a, b, c], worker_id="w1")
        finish_jobs(session=s, results=[
            JobResult(job_id=a, status="succeeded", first_step=1, last_step=5),
            JobResult(job_id=b, status="succeeded", first_step=4, last_step=9),
            JobResult(job_id=c, status="succeeded", first_step=6, last_step=9),
        ], worker_id="w1")
        insert_iterations(session=s, rows=[_step_row("w1", i) for i in range(1, 10)])
    with session_factory() as s:
        assert {j.id for j in batch_mates(session=s, job_id=a)} == {b}
        assert {j.id for j in batch_mates(session=s, job_id=b)} == {a, c}
        assert [it.step for it in iterations_of_job(session=s, job_id=a)] == [1, 2, 3, 4, 5]


def test_batch_request_counts(session_factory) -> None:
    with session_factory.begin() as s:
        batch = create_batch(session=s, tenant="t", endpoint="/v1/completions")
        ids = create_jobs(session=s, jobs=_jobs(3, batch_id=batch.id))
        start_jobs(session=s, job_ids=ids, worker_id="w")
        finish_jobs(session=s, results=[JobResult(job_id=ids[0], status="succeeded"),
                                        JobResult(job_id=ids[1], status="failed", error="x")])
        refresh_request_counts(session=s, batch=batch)
        assert (batch.request_total, batch.request_completed, batch.request_failed) == (3, 1, 1)
