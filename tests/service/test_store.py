"""Repository functions against a real PostgreSQL database (and SQLite where it differs)."""

from __future__ import annotations

import pytest

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


