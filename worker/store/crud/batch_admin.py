"""Data access the API's batch control plane needs beyond ``crud.batches``: listing per
tenant, expansion progress, a batch's jobs in input order, expiry, a batch's status. (A
batch's jobs are cancelled by ``worker.jobs.cancel``.)"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import case, func, select, update
from sqlalchemy.orm import Session

from worker.store.base import utcnow
from worker.store.job_lifecycle import OPEN
from worker.store.models import Batch, BatchProgress, Job

EXPANDABLE = ("validating", "in_progress")
"""The statuses in which a batch's expansion may still commit chunks."""
ENDED = ("completed", "failed", "expired", "cancelled")
"""A batch's final statuses: its files (if any) are written and nothing of it runs."""


def list_batches(
    *, session: Session, tenant: str, limit: int = 20, after: str | None = None
) -> list[Batch]:
    """A tenant's batches, newest first; ``after`` is the id of the last one already seen."""
    stmt = select(Batch).where(Batch.tenant == tenant)
    if after:
        anchor = session.get(Batch, after)
        if anchor is not None:
            stmt = stmt.where(
                (Batch.created_at < anchor.created_at)
                | ((Batch.created_at == anchor.created_at) & (Batch.id > anchor.id))
            )
    stmt = stmt.order_by(Batch.created_at.desc(), Batch.id).limit(limit)
    return list(session.scalars(stmt))


def batches_in_status(
    *, session: Session, statuses: tuple[str, ...], limit: int = 500
) -> list[str]:
    """Ids of batches in any of these statuses."""
    stmt = select(Batch.id).where(Batch.status.in_(statuses)).limit(limit)
    return list(session.scalars(stmt))


def expired_batch_ids(*, session: Session, now: datetime | None = None) -> list[str]:
    """Ids of unfinished batches whose completion window has passed."""
    now = now or utcnow()
    stmt = select(Batch.id).where(
        Batch.status.in_(("validating", "in_progress")),
        Batch.expires_at.is_not(None),
        Batch.expires_at < now,
    )
    return list(session.scalars(stmt))


def hold_expandable(*, session: Session, batch_id: str) -> bool:
    """Hold the batch's row for the caller's transaction if the batch is still expandable
    (whether it is). An UPDATE that changes nothing, as the transaction's first statement:
    it takes the row's lock on PostgreSQL and the write lock on SQLite (where a
    ``SELECT ... FOR UPDATE`` is a plain read, outside any transaction), so a status move
    (cancel, expiry, failure) lands wholly before or wholly after the holder's writes."""
    res = session.execute(
        update(Batch)
        .where(Batch.id == batch_id, Batch.status.in_(EXPANDABLE))
        .values(status=Batch.status)
    )
    return bool(res.rowcount)  # type: ignore[attr-defined]


def start_expiry(*, session: Session, batch_id: str, now: datetime | None = None) -> bool:
    """Take an expandable batch past its window out of expansion: ``finalizing`` with
    ``expired_at`` set (the finalizer then ends it ``expired``), in one UPDATE, so it
    holds the batch row as an expansion chunk's commit does: a chunk committed before it
    has its jobs cancelled by the expiry, one after it sees the batch no longer
    expandable and commits nothing. Returns whether it moved (False when the batch was
    cancelled, finalized or failed meanwhile)."""
    now = now or utcnow()
    res = session.execute(
        update(Batch)
        .where(Batch.id == batch_id, Batch.status.in_(EXPANDABLE))
        .values(status="finalizing", finalizing_at=now, expired_at=now)
    )
    return bool(res.rowcount)  # type: ignore[attr-defined]


def get_progress(*, session: Session, batch_id: str) -> BatchProgress:
    """The batch's progress row (created, not committed, when missing)."""
    row = session.get(BatchProgress, batch_id)
    if row is None:
        row = BatchProgress(batch_id=batch_id, lines_read=0, invalid_lines=0, expanded=0,
                            expand_attempts=0, finalize_attempts=0)
        session.add(row)
    return row


def job_count(*, session: Session, batch_id: str) -> int:
    """How many job rows of the batch exist (retention deletes old ones)."""
    return int(session.scalar(select(func.count()).where(Job.batch_id == batch_id)) or 0)


def open_job_count(*, session: Session, batch_id: str) -> int:
    """How many of the batch's jobs are still queued or running."""
    stmt = select(func.count()).where(
        Job.batch_id == batch_id, Job.status.in_(OPEN)
    )
    return int(session.scalar(stmt) or 0)


def batch_jobs_in_order(
    *, session: Session, batch_id: str, after_id: str = "", limit: int = 1000
) -> list[Job]:
    """A page of the batch's jobs by id (batch job ids sort in input-line order)."""
    stmt = (
        select(Job).where(Job.batch_id == batch_id, Job.id > after_id).order_by(Job.id).limit(limit)
    )
    return list(session.scalars(stmt))


ENDED = ("completed", "failed", "expired", "cancelled")
"""A batch's final statuses: each one's event (``batch.<status>``) is sent once reached."""


def set_batch_status(
    *, session: Session, batch_id: str, status: str, only_from: tuple[str, ...] | None = None
) -> bool:
    """Move a batch to ``status`` and stamp ``<status>_at``; with ``only_from``, only when
    it is in one of those statuses. Returns whether it moved. A move to a final status
    makes the batch's event due (``webhook_state`` waiting -> pending) in the same
    statement, so a batch that ended always has its event to send, and only once."""
    values: dict[str, object] = {"status": status}
    stamp = f"{status}_at"
    if hasattr(Batch, stamp):
        values[stamp] = utcnow()
    if status in ENDED:
        values["webhook_state"] = case(
            (Batch.webhook_state == "waiting", "pending"), else_=Batch.webhook_state)
    stmt = update(Batch).where(Batch.id == batch_id)
    if only_from:
        stmt = stmt.where(Batch.status.in_(only_from))
    res = session.execute(stmt.values(**values))
    return bool(res.rowcount)  # type: ignore[attr-defined]
