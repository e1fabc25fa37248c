"""Repository functions against a real PostgreSQL database (and SQLite where it differs)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from worker.store.crud.job_status import (
    cancel_job,
    create_jobs,
    finish_jobs,
    requeue_jobs,
    start_jobs,
)
from worker.store.crud.jobs import (
    count_by_status,
    get_job,
    list_jobs,
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




def _seed_ties(sf, *, tenant: str, groups: int, per_group: int, batch_id: str | None = None,
               start: datetime | None = None) -> list[str]:
    """``groups`` x ``per_group`` jobs of ``tenant``; the jobs of one group share one
    queued_at (ids decide their order). Returns the ids in (queued_at, id) order."""
    start = start or datetime(2026, 1, 1, tzinfo=timezone.utc)
    ordered: list[str] = []
    with sf.begin() as s:
        for g in range(groups):
            ids = create_jobs(session=s, jobs=_jobs(per_group, tenant=tenant, batch_id=batch_id),
                              now=start + timedelta(seconds=g))
            ordered += sorted(ids)
    return ordered


def _walk(s, *, limit: int, **filters) -> list[str]:
    """Every id list_jobs gives, page by page with the keyset cursor."""
    seen: list[str] = []
    while True:
        page = list_jobs(session=s, limit=limit, after=seen[-1] if seen else None, **filters)
        seen += [j.id for j in page]
        assert len(seen) < 1000, "the walk does not end"  # the seeds are far fewer
        if len(page) < limit:
            return seen


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_keyset_listing_walks_ties_once_in_order(backend: str, request: pytest.FixtureRequest) -> None:
    """Jobs sharing a queued_at are neither skipped nor repeated across page boundaries, and
    every filter combines with the cursor."""
    url = request.getfixturevalue("migrated_sqlite" if backend == "sqlite" else "migrated_pg")
    engine = make_engine(url=url)
    sf = make_session_factory(engine=engine)
    mine = _seed_ties(sf, tenant="t-keys", groups=3, per_group=7)
    in_batch = _seed_ties(sf, tenant="t-keys", groups=2, per_group=4, batch_id="batch_k")
    # another tenant's jobs at the very same instants, interleaved by id with mine
    others = _seed_ties(sf, tenant="t-other", groups=3, per_group=5)
    with sf.begin() as s:
        start_jobs(session=s, job_ids=mine[::3], worker_id="w1")
    with sf() as s:
        by_time = {j.id: (j.queued_at, j.id) for j in list_jobs(session=s, limit=1000)}
        everyone = sorted(by_time, key=by_time.__getitem__)
        assert len(everyone) == len(mine) + len(in_batch) + len(others)
        for limit in (1, 4, 7, 1000):
            assert _walk(s, limit=limit) == everyone
        assert _walk(s, limit=4, tenant="t-keys") == sorted(mine + in_batch, key=by_time.__getitem__)
        assert _walk(s, limit=2, tenant="t-keys", status="running") == mine[::3]
        assert _walk(s, limit=3, tenant="t-keys", status="queued", batch_id="batch_k") == in_batch
        assert _walk(s, limit=3, status="running") == mine[::3]
        # the cursor is a position: another tenant's job there still means "after it"
        cut = others[7]
        assert [j.id for j in list_jobs(session=s, tenant="t-keys", after=cut, limit=100)] == [
            i for i in everyone[everyone.index(cut) + 1:] if i not in others
        ]
        assert list_jobs(session=s, after="job_missing") == []
        assert list_jobs(session=s, after=everyone[-1]) == []
    engine.dispose()
