"""Data access for ``batches``: create, read, refresh the request counts."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from worker.store.models import Batch


def new_batch_id() -> str:
    """A fresh batch id (``batch_`` + 32 hex digits)."""
    return "batch_" + uuid.uuid4().hex


def create_batch(
    *,
    session: Session,
    tenant: str,
    endpoint: str,
    input_file_id: str | None = None,
    completion_window: str = "24h",
    metadata: dict[str, Any] | None = None,
    batch_id: str | None = None,
    idempotency_key: str | None = None,
    request_digest: str | None = None,
    callback_url: str | None = None,
) -> Batch:
    """Add a batch in status ``validating`` (the caller commits; a duplicate idempotency key
    for the tenant raises IntegrityError then). With a ``callback_url`` its event waits
    for the batch to end (``webhook_state`` waiting)."""
    batch = Batch(
        id=batch_id or new_batch_id(),
        tenant=tenant,
        endpoint=endpoint,
        input_file_id=input_file_id,
        completion_window=completion_window,
        metadata_=metadata,
        request_total=0,
        request_completed=0,
        request_failed=0,
        idempotency_key=idempotency_key,
        request_digest=request_digest,
        callback_url=callback_url,
        webhook_state="waiting" if callback_url else "none",
        webhook_attempts=0,
    )
    session.add(batch)
    return batch


def find_by_idempotency_key(*, session: Session, tenant: str, key: str) -> Batch | None:
    """The tenant's batch created with idempotency key ``key``, or None."""
    stmt = select(Batch).where(Batch.tenant == tenant, Batch.idempotency_key == key)
    return session.scalars(stmt).first()


def get_batch(*, session: Session, batch_id: str) -> Batch | None:
    """The batch with this id, or None."""
    return session.get(Batch, batch_id)
