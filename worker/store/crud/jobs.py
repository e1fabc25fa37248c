"""Data access for ``jobs``: insert, read, start, finish, requeue, fail, cancel."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    ColumnElement,
    bindparam,
    case,
    func,
    insert,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session, aliased

from worker.store.base import UTCDateTime, utcnow
from worker.store.job_lifecycle import OPEN, sources
from worker.store.models import Job, JobStatus
from worker.store.schemas import JobResult, NewJob

# "may be finished" as literal SQL, usable in executemany (no expanding IN parameter)
_FINISHABLE_SQL = text(
    "jobs.status IN (" + ", ".join(f"'{s}'" for s in sources(JobStatus.SUCCEEDED.value)) + ")"
)


def new_job_id() -> str:
    """A fresh, unique job id (``job_`` + 32 hex digits)."""
    return "job_" + uuid.uuid4().hex


def keyed_job_id(batch_id: str, key: str) -> str:
    """A job id determined by (batch id, custom id): the same line enqueued twice under one
    batch id maps to one job."""
    return "job_" + hashlib.sha256(f"{batch_id}\0{key}".encode()).hexdigest()[:32]


def create_jobs(
    *,
    session: Session,
    jobs: Sequence[NewJob],
    now: datetime | None = None,
    skip_existing: bool = False,
) -> list[str]:
    """Insert queued jobs in one statement and return their ids (the caller commits). With
    ``skip_existing`` an id already stored is left alone and only the ids inserted now are
    returned (re-running an interrupted producer with deterministic ids)."""
    if not jobs:
        return []
    now = now or utcnow()
    rows = []
    for job in jobs:
        job.id = job.id or new_job_id()
        rows.append(
            {
                "id": job.id,
                "tenant": job.tenant,
                "batch_id": job.batch_id,
                "custom_id": job.custom_id,
                "queue_class": job.queue_class,
                "status": JobStatus.QUEUED.value,
                "priority": job.priority,
                "request": job.request,
                "queued_at": now,
                "attempts": 0,
            }
        )
    if skip_existing:
        ins = (
            pg_insert(Job) if session.get_bind().dialect.name == "postgresql" else sqlite_insert(Job)
        )
        fresh = set(session.scalars(ins.values(rows).on_conflict_do_nothing().returning(Job.id)))
        return [job.id for job in jobs if job.id in fresh]
    session.execute(insert(Job), rows)
    return [job.id for job in jobs]


def get_job(*, session: Session, job_id: str) -> Job | None:
    """The job with this id, or None."""
    return session.get(Job, job_id)


def list_jobs(
    *,
    session: Session,
    status: str | None = None,
    tenant: str | None = None,
    batch_id: str | None = None,
    limit: int = 100,
    after: str | None = None,
) -> list[Job]:
    """Jobs in queue order ((queued_at, id)), optionally filtered by status, tenant and batch.
    ``after`` is a job id, the cursor: only rows strictly after that job in that order (none
    when no job has that id). A keyset, so a deep page costs what the first one does."""
    stmt = select(Job)
    if status is not None:
        stmt = stmt.where(Job.status == status)
    if tenant is not None:
        stmt = stmt.where(Job.tenant == tenant)
    if batch_id is not None:
        stmt = stmt.where(Job.batch_id == batch_id)
    if after is not None:
        stmt = stmt.where(after_job(after))
    stmt = stmt.order_by(Job.queued_at, Job.id).limit(limit)
    return list(session.scalars(stmt))


def after_job(job_id: str) -> ColumnElement[bool]:
    """``(queued_at, id) > (that job's queued_at, id)`` as one row-value comparison against a
    row subquery (PostgreSQL, and SQLite from 3.15): one statement, served by the indexes
    ending in (queued_at, id). NULL, so no row, when there is no job ``job_id``."""
    anchor = aliased(Job, name="anchor")  # not correlated with the outer ``jobs``
    position = select(anchor.queued_at, anchor.id).where(anchor.id == job_id).scalar_subquery()
    return tuple_(Job.queued_at, Job.id) > position


def count_by_status(
    *, session: Session, batch_id: str | None = None, tenant: str | None = None
) -> dict[str, int]:
    """How many jobs are in each status (optionally within one batch and/or one tenant)."""
    stmt = select(Job.status, func.count()).group_by(Job.status)
    if batch_id is not None:
        stmt = stmt.where(Job.batch_id == batch_id)
    if tenant is not None:
        stmt = stmt.where(Job.tenant == tenant)
    return {status: n for status, n in session.execute(stmt)}


def statuses(*, session: Session, job_ids: Iterable[str]) -> dict[str, str]:
    """Current status of each of these jobs (missing ids are absent from the answer)."""
    ids = list(job_ids)
    if not ids:
        return {}
    rows = session.execute(select(Job.id, Job.status).where(Job.id.in_(ids)))
    return {job_id: status for job_id, status in rows}


def start_jobs(
    *, session: Session, job_ids: Sequence[str], worker_id: str, now: datetime | None = None
) -> set[str]:
    """Mark these jobs running on ``worker_id`` (attempts + 1) and return the ids that may
    run: those still queued or running. Terminal and unknown ids are left out, so a
    redelivered job that already ended is skipped. A job whose cancel was recorded while a
    (since dead) worker ran it ends ``cancelled`` here instead: the durable cancel wins."""
    if not job_ids:
        return set()
    now = now or utcnow()
    ids = list(job_ids)
    session.execute(
        update(Job)
        .where(Job.id.in_(ids), Job.status.in_(sources(JobStatus.CANCELLED.value)),
               Job.cancel_requested_at.is_not(None))
        .values(status=JobStatus.CANCELLED.value, finished_at=now, finish_reason="abort")
    )
    stmt = (
        update(Job)
        .where(Job.id.in_(ids), Job.status.in_(sources(JobStatus.RUNNING.value)))
        .values(
            status=JobStatus.RUNNING.value,
            worker_id=worker_id,
            started_at=now,
            attempts=Job.attempts + 1,
        )
        .returning(Job.id)
    )
    return set(session.scalars(stmt))


def finish_jobs(
    *, session: Session, results: Sequence[JobResult], worker_id: str | None = None
) -> None:
    """Write final results in one executemany. A job that already ended keeps its first
    result: the write is conditional on the job still being open (idempotent by job id)."""
    if not results:
        return
    table: Any = Job.__table__
    stmt = (
        update(table)
        .where(table.c.id == bindparam("b_id"), _FINISHABLE_SQL)
        .values(
            status=bindparam("b_status"),
            text=bindparam("b_text"),
            finish_reason=bindparam("b_finish_reason"),
            prompt_tokens=bindparam("b_prompt_tokens"),
            completion_tokens=bindparam("b_completion_tokens"),
            error=bindparam("b_error"),
            started_at=func.coalesce(
                bindparam("b_started_at", type_=UTCDateTime()), Job.__table__.c.started_at
            ),
            first_token_at=bindparam("b_first_token_at"),
            finished_at=bindparam("b_finished_at"),
            first_step=bindparam("b_first_step"),
            last_step=bindparam("b_last_step"),
            isolation=bindparam("b_isolation"),
            choices=bindparam("b_choices", type_=JSON()),
            **({"worker_id": bindparam("b_worker_id")} if worker_id else {}),
        )
    )
    now = utcnow()
    params = [
        {
            "b_id": r.job_id,
            "b_status": r.status,
            "b_text": r.text,
            "b_finish_reason": r.finish_reason,
            "b_prompt_tokens": r.prompt_tokens,
            "b_completion_tokens": r.completion_tokens,
            "b_error": r.error,
            "b_started_at": r.started_at,
            "b_first_token_at": r.first_token_at,
            "b_finished_at": r.finished_at or now,
            "b_first_step": r.first_step,
            "b_last_step": r.last_step,
            "b_isolation": r.isolation,
            "b_choices": r.choices,
            **({"b_worker_id": worker_id} if worker_id else {}),
        }
        for r in results
    ]
    session.connection().execute(stmt, params)


def fail_job(*, session: Session, job_id: str, error: str) -> bool:
    """Fail one open job with ``error``; False if it had already ended or does not exist."""
    res = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status.in_(sources(JobStatus.FAILED.value)))
        .values(status=JobStatus.FAILED.value, error=error, finished_at=utcnow())
    )
    return bool(res.rowcount)  # type: ignore[attr-defined]


def requeue_jobs(
    *, session: Session, job_ids: Sequence[str], worker_id: str, uncount: bool = False
) -> int:
    """Put jobs this worker started but will not finish back to queued. With ``uncount``
    their start is not counted as an attempt (the worker, not the job, was at fault)."""
    if not job_ids:
        return 0
    res = session.execute(
        update(Job)
        .where(
            Job.id.in_(list(job_ids)),
            Job.status.in_(sources(JobStatus.QUEUED.value)),
            Job.worker_id == worker_id,
        )
        .values(
            status=JobStatus.QUEUED.value,
            started_at=None,
            **({"attempts": case((Job.attempts > 0, Job.attempts - 1), else_=0)} if uncount else {}),
        )
    )
    return int(res.rowcount)  # type: ignore[attr-defined]


def cancel_job(*, session: Session, job_id: str) -> str | None:
    """Cancel a job: a queued one ends at once (returns ``cancelled``); for a running one
    the request is recorded (``cancel_requested_at``) and its worker must abort it (returns
    ``running``: signal it through the queue, which only carries the signal); an ended one
    is left as is (returns its status). None if there is no such job."""
    now = utcnow()
    res = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.QUEUED.value)
        .values(status=JobStatus.CANCELLED.value, finished_at=now, finish_reason="abort")
    )
    if res.rowcount:  # type: ignore[attr-defined]
        return JobStatus.CANCELLED.value
    session.execute(
        update(Job)
        .where(
            Job.id == job_id,
            Job.status == JobStatus.RUNNING.value,
            Job.cancel_requested_at.is_(None),
        )
        .values(cancel_requested_at=now)
    )
    status = session.scalar(select(Job.status).where(Job.id == job_id))
    return status


def cancel_requested_among(*, session: Session, job_ids: Sequence[str]) -> set[str]:
    """Which of these jobs are still open with a recorded cancel request (what a worker
    honours even when the Redis signal was lost)."""
    if not job_ids:
        return set()
    stmt = select(Job.id).where(
        Job.id.in_(list(job_ids)),
        Job.status.in_(OPEN),
        Job.cancel_requested_at.is_not(None),
    )
    return set(session.scalars(stmt))


def open_job_heads(
    *, session: Session, queued_before: datetime, limit: int = 10_000, after_id: str = ""
) -> list[tuple[str, str, str | None]]:
    """(id, status, worker_id) of queued or running jobs queued before ``queued_before``, by
    id: what the reconciler needs to pick candidates, without loading request bodies."""
    stmt = (
        select(Job.id, Job.status, Job.worker_id)
        .where(Job.status.in_(OPEN), Job.queued_at < queued_before, Job.id > after_id)
        .order_by(Job.id)
        .limit(limit)
    )
    return [(i, st, w) for i, st, w in session.execute(stmt)]


def open_jobs_with_ids(*, session: Session, job_ids: Sequence[str]) -> list[Job]:
    """The full rows of those of these jobs that are still queued or running."""
    if not job_ids:
        return []
    stmt = select(Job).where(Job.id.in_(list(job_ids)), Job.status.in_(OPEN)).order_by(Job.id)
    return list(session.scalars(stmt))


