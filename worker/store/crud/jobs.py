"""Reads of ``jobs`` (and the ids new jobs get). Every write of a job's status is in
``worker.store.crud.job_status``, which only the lifecycle (``worker.jobs``) may import."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, func, select, tuple_
from sqlalchemy.orm import Session, aliased

from worker.store.job_lifecycle import OPEN
from worker.store.models import Job


def new_job_id() -> str:
    """A fresh, unique job id (``job_`` + 32 hex digits)."""
    return "job_" + uuid.uuid4().hex


def keyed_job_id(batch_id: str, key: str) -> str:
    """A job id determined by (batch id, custom id): the same line enqueued twice under one
    batch id maps to one job."""
    return "job_" + hashlib.sha256(f"{batch_id}\0{key}".encode()).hexdigest()[:32]


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


@dataclass(frozen=True)
class JobRoute:
    """Where a job's stream entry belongs: its status, model and deadline."""

    status: str
    model: str | None
    deadline: datetime | None


def job_routes(*, session: Session, job_ids: Iterable[str]) -> dict[str, JobRoute]:
    """The route of each of these jobs (missing ids are absent from the answer)."""
    ids = list(job_ids)
    if not ids:
        return {}
    rows = session.execute(
        select(Job.id, Job.status, Job.model, Job.deadline).where(Job.id.in_(ids))
    )
    return {job_id: JobRoute(status, model, deadline) for job_id, status, model, deadline in rows}


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


@dataclass
class JobHead:
    """What the reconciler needs of an open job to pick it, without its request body."""

    id: str
    status: str
    worker_id: str | None
    model: str | None


def open_job_heads(
    *, session: Session, queued_before: datetime, limit: int = 10_000, after_id: str = ""
) -> list[JobHead]:
    """The heads of queued or running jobs queued before ``queued_before``, by id."""
    stmt = (
        select(Job.id, Job.status, Job.worker_id, Job.model)
        .where(Job.status.in_(OPEN), Job.queued_at < queued_before, Job.id > after_id)
        .order_by(Job.id)
        .limit(limit)
    )
    return [JobHead(i, st, w, m) for i, st, w, m in session.execute(stmt)]


def open_jobs_with_ids(*, session: Session, job_ids: Sequence[str]) -> list[Job]:
    """The full rows of those of these jobs that are still queued or running."""
    if not job_ids:
        return []
    stmt = select(Job).where(Job.id.in_(list(job_ids)), Job.status.in_(OPEN)).order_by(Job.id)
    return list(session.scalars(stmt))
