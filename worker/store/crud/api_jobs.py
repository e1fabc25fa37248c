"""Data access for ``api_jobs``: idempotency keys and webhook delivery state (claimed\nunder a :class:`~worker.store.crud.leases.Lease`)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from worker.store.base import utcnow
from worker.store.crud.deliveries import DeliveryColumns, record_attempt
from worker.store.crud.leases import Lease, LeaseColumns
from worker.store.job_lifecycle import TERMINAL
from worker.store.models import ApiJob, Job


def add_api_job(
    *,
    session: Session,
    job_id: str,
    tenant: str,
    idempotency_key: str | None,
    body_hash: str | None,
    callback_url: str | None,
) -> ApiJob:
    """Add the API-side row of a new job (the caller commits; a duplicate idempotency key
    raises IntegrityError at flush)."""
    row = ApiJob(
        job_id=job_id,
        tenant=tenant,
        idempotency_key=idempotency_key,
        body_hash=body_hash,
        callback_url=callback_url,
        webhook_state="pending" if callback_url else "none",
        webhook_attempts=0,
    )
    session.add(row)
    return row


def find_by_idempotency_key(*, session: Session, tenant: str, key: str) -> ApiJob | None:
    """The job a tenant already submitted under ``key``, or None."""
    stmt = select(ApiJob).where(ApiJob.tenant == tenant, ApiJob.idempotency_key == key)
    return session.scalar(stmt)


def get_api_job(*, session: Session, job_id: str) -> ApiJob | None:
    """The API-side row of a job, or None."""
    return session.get(ApiJob, job_id)


WEBHOOK_LEASE = LeaseColumns(
    key=ApiJob.job_id, holder=ApiJob.webhook_holder, until=ApiJob.webhook_next_at
)
"""Where a webhook delivery's lease lives: the holder, and ``webhook_next_at`` as expiry."""


def webhook_lease(ttl: timedelta) -> Lease:
    """A new claimer's lease on webhook deliveries (its own holder id)."""
    return Lease(columns=WEBHOOK_LEASE, ttl=ttl)


def claim_due_webhooks(
    *, session: Session, lease: Lease, now: datetime | None = None, limit: int = 100
) -> list[str]:
    """Claim the job ids whose webhook is pending, whose job has ended and whose next try
    is due (or whose last claimer's lease ran out): rows locked by another claimer are
    skipped (``FOR UPDATE SKIP LOCKED``) and the claimed ones are ``lease``'s until it
    expires, so no two claimers send the same delivery. Call inside a transaction."""
    now = now or utcnow()
    stmt = (
        select(ApiJob.job_id)
        .join(Job, Job.id == ApiJob.job_id)
        .where(
            ApiJob.webhook_state == "pending",
            Job.status.in_(TERMINAL),
            (ApiJob.webhook_next_at.is_(None)) | (ApiJob.webhook_next_at <= now),
        )
        .limit(limit)
        .with_for_update(skip_locked=True, of=ApiJob)
    )
    ids = list(session.scalars(stmt))
    lease.claim(session, ids)
    return ids


WEBHOOK_STATE = DeliveryColumns(
    state=ApiJob.webhook_state, attempts=ApiJob.webhook_attempts, error=ApiJob.webhook_error
)


def record_webhook_attempt(*, job_id: str, **attempt: Any) -> bool:
    """Count one delivery attempt of a job's webhook (``deliveries.record_attempt``: the
    lease, delivered or not, the error, the next try, giving up); False when the lease ran
    out and another claimer took the delivery over."""
    return record_attempt(columns=WEBHOOK_STATE, key=job_id, **attempt)


def get_job_with_meta(*, session: Session, job_id: str) -> tuple[Job, ApiJob | None] | None:
    """A job and its API-side row in one query (the status poll path), or None."""
    stmt = select(Job, ApiJob).outerjoin(ApiJob, ApiJob.job_id == Job.id).where(Job.id == job_id)
    row = session.execute(stmt).first()
    return (row[0], row[1]) if row is not None else None
