"""The expansion lease of a batch: which process is reading its input file, and until when
it counts as alive. A live expansion renews its lease with every chunk it commits; a batch
that is still expandable with an expired (or no) lease is resumed by the control plane."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from worker.store.base import utcnow
from worker.store.crud.batch_admin import EXPANDABLE, get_progress
from worker.store.models import Batch, BatchProgress


def claim_expansion(
    *, session: Session, batch_id: str, owner: str, ttl: timedelta, max_attempts: int = 0
) -> str:
    """Take the batch's expansion lease for ``owner`` (the caller commits), counting the
    attempt. Returns ``claimed``; ``expanded`` (nothing left to read); ``busy`` (a live
    expansion holds it); ``exhausted`` (``max_attempts`` runs since the last committed
    chunk, when not 0: the caller fails the batch); or the batch's status when it is no
    longer expandable (``missing`` when absent)."""
    batch = session.get(Batch, batch_id, with_for_update=True)  # serializes claimers
    if batch is None:
        return "missing"
    if batch.status not in EXPANDABLE:
        return batch.status
    progress = get_progress(session=session, batch_id=batch_id)
    if progress.expanded:
        return "expanded"
    now = utcnow()
    if progress.lease_owner not in (None, owner) and _alive(progress.lease_until, now):
        return "busy"
    if max_attempts and (progress.expand_attempts or 0) >= max_attempts:
        return "exhausted"
    progress.expand_attempts = (progress.expand_attempts or 0) + 1
    progress.lease_owner = owner
    progress.lease_until = now + ttl
    return "claimed"


def holds_lease(*, progress: BatchProgress, owner: str) -> bool:
    """Whether ``owner`` still holds the lease (nobody took it over after it expired)."""
    return progress.lease_owner == owner


def release_expansion(*, session: Session, batch_id: str, owner: str) -> None:
    """Give the lease up at once (the expansion ended or failed); no-op when not ours."""
    progress = session.get(BatchProgress, batch_id, with_for_update=True)
    if progress is not None and progress.lease_owner == owner:
        progress.lease_owner = None
        progress.lease_until = None


def stalled_expansions(*, session: Session, limit: int = 100) -> list[str]:
    """Ids of expandable batches with unread lines and no live expansion: never started
    (no progress row) or whose expansion's lease expired (its process died)."""
    now = utcnow()
    stmt = (
        select(Batch.id)
        .outerjoin(BatchProgress, BatchProgress.batch_id == Batch.id)
        .where(
            Batch.status.in_(EXPANDABLE),
            or_(BatchProgress.batch_id.is_(None), BatchProgress.expanded == 0),
            or_(BatchProgress.lease_until.is_(None), BatchProgress.lease_until < now),
        )
        .order_by(Batch.created_at)
        .limit(limit)
    )
    return list(session.scalars(stmt))


def _alive(until: datetime | None, now: datetime) -> bool:
    return until is not None and until > now
