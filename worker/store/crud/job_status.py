"""Every write of ``jobs.status``: the INSERT that creates a job ``queued`` and each UPDATE
that moves one, each conditional on the statuses its move starts from
(:data:`worker.store.job_lifecycle.MOVES`). Only ``worker.jobs`` imports this module (an
import contract in ``pyproject.toml``); the reads are ``worker.store.crud.jobs``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    ColumnElement,
    bindparam,
    case,
    func,
    insert,
    literal,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from worker.store.base import UTCDateTime, utcnow
from worker.store.crud.jobs import new_job_id
from worker.store.job_lifecycle import (
    CANCEL,
    FAIL,
    FINISH,
    HAND_BACK,
    RECORD_CANCEL,
    START,
    START_CANCELLED,
)
from worker.store.models import Job, JobStatus
from worker.store.schemas import JobResult, NewJob

# "may be finished" as literal SQL, usable in executemany (no expanding IN parameter)
_FINISHABLE_SQL = text("jobs.status IN (" + ", ".join(f"'{s}'" for s in FINISH.sources) + ")")


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
                "model": job.model,
                "status": JobStatus.QUEUED.value,
                "priority": job.priority,
                "request": job.request,
                "queued_at": now,
                "attempts": 0,
                "max_tokens": job.max_tokens,
                "deadline": job.deadline,
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


def start_jobs(
    *, session: Session, job_ids: Sequence[str], worker_id: str, now: datetime | None = None
) -> set[str]:
    """Mark these jobs running on ``worker_id`` (attempts + 1) and return the ids that may
    run: those still queued or running. Terminal and unknown ids are left out, so a
    redelivered job that already ended is skipped. A job whose cancel was recorded (while a
    since dead worker ran it, or before it was handed back) ends ``cancelled`` here instead:
    the durable cancel wins."""
    if not job_ids:
        return set()
    now = now or utcnow()
    ids = list(job_ids)
    session.execute(
        update(Job)
        .where(Job.id.in_(ids), Job.status.in_(START_CANCELLED.sources),
               Job.cancel_requested_at.is_not(None))
        .values(status=JobStatus.CANCELLED.value, finished_at=now, finish_reason="abort")
    )
    stmt = (
        update(Job)
        .where(Job.id.in_(ids), Job.status.in_(START.sources))
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
            cached_tokens=bindparam("b_cached_tokens"),
            engine_seconds=bindparam("b_engine_seconds"),
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
            "b_cached_tokens": r.cached_tokens,
            "b_engine_seconds": r.engine_seconds,
            **({"b_worker_id": worker_id} if worker_id else {}),
        }
        for r in results
    ]
    session.connection().execute(stmt, params)


def fail_job(*, session: Session, job_id: str, error: str) -> bool:
    """Fail one open job with ``error``; False if it had already ended or does not exist."""
    res = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status.in_(FAIL.sources))
        .values(status=JobStatus.FAILED.value, error=error, finished_at=utcnow())
    )
    return bool(res.rowcount)  # type: ignore[attr-defined]


def requeue_jobs(
    *, session: Session, job_ids: Sequence[str], worker_id: str, uncount: bool = False
) -> int:
    """Put jobs this worker started but will not finish back to queued; one whose cancel
    was recorded ends ``cancelled`` instead (nobody else would end it before a worker
    picked it up again). With ``uncount`` their start is not counted as an attempt (the
    worker, not the job, was at fault)."""
    if not job_ids:
        return 0
    cancelled = Job.cancel_requested_at.is_not(None)
    res = session.execute(
        update(Job)
        .where(
            Job.id.in_(list(job_ids)),
            Job.status.in_(HAND_BACK.sources),
            Job.worker_id == worker_id,
        )
        .values(
            status=case((cancelled, JobStatus.CANCELLED.value), else_=JobStatus.QUEUED.value),
            started_at=case((cancelled, Job.started_at), else_=None),
            finished_at=case((cancelled, utcnow()), else_=Job.finished_at),
            finish_reason=case((cancelled, "abort"), else_=Job.finish_reason),
            **({"attempts": case((Job.attempts > 0, Job.attempts - 1), else_=0)} if uncount else {}),
        )
    )
    return int(res.rowcount)  # type: ignore[attr-defined]


def cancel_job(*, session: Session, job_id: str) -> str | None:
    """Cancel a job: a queued one ends at once (returns ``cancelled``); for a running one
    the request is recorded (``cancel_requested_at``) and its worker must abort it (returns
    ``running``: signal it through the queue, which only carries the signal); an ended one
    is left as is (returns its status). None if there is no such job."""
    moved = _cancel(session, Job.id == job_id)
    if moved:
        return moved[0][1]
    return session.scalar(select(Job.status).where(Job.id == job_id))


def cancel_batch_jobs(*, session: Session, batch_id: str) -> tuple[int, list[str]]:
    """Cancel every open job of a batch as :func:`cancel_job` does one, in one statement:
    returns how many ended at once and the ids of the running ones whose cancel was
    recorded (their workers need the signal)."""
    moved = _cancel(session, Job.batch_id == batch_id)
    running = sorted(i for i, status in moved if status in RECORD_CANCEL.targets)
    return len(moved) - len(running), running


def cancel_queued_batch_jobs(*, session: Session, batch_id: str) -> int:
    """End the batch's jobs no worker holds ``cancelled`` (those running are left to
    finish); returns how many."""
    res = session.execute(
        update(Job)
        .where(Job.batch_id == batch_id, Job.status.in_(CANCEL.sources))
        .values(status=JobStatus.CANCELLED.value, finished_at=utcnow(), finish_reason="abort")
    )
    return int(res.rowcount)  # type: ignore[attr-defined]


def _cancel(session: Session, which: ColumnElement[bool]) -> list[tuple[str, str]]:
    """One UPDATE over the open jobs ``which`` selects: those no worker holds end
    ``cancelled``, the others get ``cancel_requested_at`` (the first request's time is
    kept). One statement, so a job that moves between the two (handed back, picked up) is
    one or the other, never neither. Returns (id, status afterwards) of each job it met."""
    now = literal(utcnow(), UTCDateTime())
    at_once = Job.status.in_(CANCEL.sources)
    stmt = (
        update(Job)
        .where(which, Job.status.in_(CANCEL.sources + RECORD_CANCEL.sources))
        .values(
            status=case((at_once, JobStatus.CANCELLED.value), else_=Job.status),
            finished_at=case((at_once, now), else_=Job.finished_at),
            finish_reason=case((at_once, "abort"), else_=Job.finish_reason),
            cancel_requested_at=case(
                (at_once, Job.cancel_requested_at),
                else_=func.coalesce(Job.cancel_requested_at, now),
            ),
        )
        .returning(Job.id, Job.status)
    )
    return [(job_id, status) for job_id, status in session.execute(stmt)]


def assign_model(*, session: Session, job_ids: Sequence[str], model: str) -> list[str]:
    """Give ``model`` to those of these jobs that have none (rows from before revision
    0014); returns their ids. Jobs with a model keep theirs."""
    if not job_ids:
        return []
    ids = list(job_ids)
    chosen = list(session.scalars(
        select(Job.id).where(Job.id.in_(ids), Job.model.is_(None)).with_for_update()
    ))
    if chosen:
        session.execute(update(Job).where(Job.id.in_(chosen), Job.model.is_(None))
                        .values(model=model))
    return chosen
