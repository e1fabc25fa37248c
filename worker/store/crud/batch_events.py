"""Data access for the delivery of batch events (``batch.completed``, ``.failed``,
``.expired``, ``.cancelled``): the event of a batch that ended is due once
(``webhook_state`` pending, set with its final status by ``batch_admin.set_batch_status``)
and claimed under a :class:`~worker.store.crud.leases.Lease` on the batch row, as job
webhooks are on ``api_jobs``."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from worker.store.base import utcnow
from worker.store.crud.batch_admin import ENDED
from worker.store.crud.deliveries import DeliveryColumns
from worker.store.crud.leases import Lease, LeaseColumns
from worker.store.models import Batch

BATCH_EVENT_LEASE = LeaseColumns(
    key=Batch.id, holder=Batch.webhook_holder, until=Batch.webhook_next_at
)
"""Where a batch event's lease lives: the holder, and ``webhook_next_at`` as expiry."""


def batch_event_lease(ttl: timedelta) -> Lease:
    """A new claimer's lease on batch events (its own holder id)."""
    return Lease(columns=BATCH_EVENT_LEASE, ttl=ttl)


def claim_due_batch_events(
    *, session: Session, lease: Lease, now: datetime | None = None, limit: int = 100
) -> list[str]:
    """Claim the ids of ended batches whose event is pending and due (or whose last
    claimer's lease ran out), skipping rows another claimer has locked (``FOR UPDATE SKIP
    LOCKED``). Call inside a transaction."""
    now = now or utcnow()
    stmt = (
        select(Batch.id)
        .where(
            Batch.webhook_state == "pending",
            Batch.status.in_(ENDED),
            (Batch.webhook_next_at.is_(None)) | (Batch.webhook_next_at <= now),
        )
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    ids = list(session.scalars(stmt))
    lease.claim(session, ids)
    return ids


BATCH_EVENT_STATE = DeliveryColumns(  # attempts: deliveries.record_attempt
    state=Batch.webhook_state, attempts=Batch.webhook_attempts, error=Batch.webhook_error
)

