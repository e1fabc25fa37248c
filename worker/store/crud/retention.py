"""Retention: delete old engine iteration rows; clear the request and result of jobs ended
long ago, then delete their rows; delete the rows of batches ended long ago once their jobs
are gone.

Nothing here writes ``jobs.status`` (only ``worker.jobs`` may): a job is touched only once
it has ended, and only when nothing still needs it: no open batch of its own (one not yet
ended has not written its output and error files, which are read from these rows), and no
webhook still pending delivery. Each call handles at most ``limit`` jobs, so its caller
commits per chunk and a big backlog never holds one long transaction."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, delete, exists, func, null, select, update
from sqlalchemy.orm import Session

from worker.protocol.openai_batch import CHAT_ENDPOINT, COMPLETIONS_ENDPOINT
from worker.store.crud.batch_admin import ENDED
from worker.store.crud.tenant_usage import OPEN_BATCH_STATUSES
from worker.store.job_lifecycle import TERMINAL
from worker.store.models import ApiJob, Batch, BatchProgress, Iteration, Job


def prune_iterations(*, session: Session, older_than: datetime) -> int:
    """Delete iteration rows recorded before ``older_than``; returns how many."""
    res = session.execute(delete(Iteration).where(Iteration.time < older_than))
    return int(res.rowcount)  # type: ignore[attr-defined]


def _settled(ended_before: datetime) -> ColumnElement[bool]:
    """Jobs that ended before ``ended_before`` and that nothing needs any more: not of a
    batch still open, no webhook pending."""
    open_batch = exists().where(Batch.id == Job.batch_id, Batch.status.in_(OPEN_BATCH_STATUSES))
    pending_webhook = exists().where(ApiJob.job_id == Job.id, ApiJob.webhook_state == "pending")
    return and_(
        Job.status.in_(TERMINAL),
        Job.finished_at.is_not(None),
        Job.finished_at < ended_before,
        ~open_batch,
        ~pending_webhook,
    )


def _due(session: Session, where: ColumnElement[bool], limit: int) -> list[tuple[Any, ...]]:
    """Up to ``limit`` (id, url, has-messages) of the jobs ``where`` selects, oldest end
    first, locked (others holding a row skip it; SQLite has no row locks)."""
    stmt = (
        select(Job.id, Job.request["url"].as_string(), Job.request["messages"].as_string())
        .where(where)
        .order_by(Job.finished_at)
        .limit(limit)
        .with_for_update(of=Job, skip_locked=True)
    )
    return [tuple(row) for row in session.execute(stmt).all()]


def _endpoint(url: str | None, messages: str | None) -> str:
    """The endpoint of a stored request from its ``url`` (``{"url", "body"}`` form), or,
    for a bare body, from whether it has ``messages``."""
    if url:
        return url
    return CHAT_ENDPOINT if messages is not None else COMPLETIONS_ENDPOINT


def expire_job_results(
    *, session: Session, ended_before: datetime, now: datetime, limit: int
) -> int:
    """Clear the request body and result (text, choices, error detail) of up to ``limit``
    settled jobs ended before ``ended_before`` and not cleared yet; returns how many. The
    request keeps its endpoint (``{"url": ..., "body": {}}``); status, token counts,
    finish reason, timeline, tenant, batch id and custom_id stay; ``result_expired_at``
    says when they went."""
    rows = _due(session, and_(Job.result_expired_at.is_(None), _settled(ended_before)), limit)
    by_endpoint: dict[str, list[str]] = defaultdict(list)
    for job_id, url, messages in rows:
        by_endpoint[_endpoint(url, messages)].append(job_id)
    for endpoint, ids in by_endpoint.items():
        session.execute(
            update(Job)
            .where(Job.id.in_(ids))
            .values(request={"url": endpoint, "body": {}}, text=None, choices=null(),
                    error=None, result_expired_at=now)
            .execution_options(synchronize_session=False)
        )
    return len(rows)


def delete_old_jobs(*, session: Session, ended_before: datetime, limit: int) -> int:
    """Delete up to ``limit`` settled jobs ended before ``ended_before``, with their
    ``api_jobs`` rows; returns how many."""
    ids: Sequence[str] = [row[0] for row in _due(session, _settled(ended_before), limit)]
    if ids:
        session.execute(delete(ApiJob).where(ApiJob.job_id.in_(ids)))
        session.execute(delete(Job).where(Job.id.in_(ids)))
    return len(ids)


def delete_old_batches(*, session: Session, ended_before: datetime, limit: int) -> int:
    """Delete up to ``limit`` batches that ended before ``ended_before`` and have no job
    row left (job retention took them), with their progress rows; returns how many. Their
    files stay: files have a retention of their own (``expires_at``, or deleted by the
    tenant)."""
    ended_at = func.coalesce(Batch.completed_at, Batch.failed_at, Batch.expired_at,
                             Batch.cancelled_at, Batch.created_at)
    stmt = (
        select(Batch.id)
        .where(Batch.status.in_(ENDED), ended_at < ended_before,
               ~exists().where(Job.batch_id == Batch.id))
        .order_by(ended_at)
        .limit(limit)
        .with_for_update(of=Batch, skip_locked=True)
    )
    ids = list(session.scalars(stmt))
    if ids:
        session.execute(delete(BatchProgress).where(BatchProgress.batch_id.in_(ids)))
        session.execute(delete(Batch).where(Batch.id.in_(ids)))
    return len(ids)
