"""Data access for ``files``: create, read (per tenant), list, delete, expiry."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from sqlalchemy import Exists, delete, exists, select
from sqlalchemy.orm import Session

from worker.store.base import utcnow
from worker.store.crud.tenant_usage import OPEN_BATCH_STATUSES
from worker.store.models import Batch, StoredFile


def new_file_id() -> str:
    """A fresh file id (``file-`` + 32 hex digits, as OpenAI spells them)."""
    return "file-" + uuid.uuid4().hex


def create_file(
    *,
    session: Session,
    file_id: str,
    tenant: str,
    purpose: str,
    filename: str,
    size: int,
    path: str,
    expires_after: int | None = None,
) -> StoredFile:
    """Add a file row (the caller has written the bytes and commits); with
    ``expires_after`` (seconds) it expires that long after its creation."""
    now = utcnow()
    row = StoredFile(
        id=file_id,
        tenant=tenant,
        purpose=purpose,
        filename=filename,
        bytes=size,
        path=path,
        created_at=now,
        expires_at=now + timedelta(seconds=expires_after) if expires_after else None,
    )
    session.add(row)
    return row


def get_file(*, session: Session, file_id: str, tenant: str | None = None) -> StoredFile | None:
    """The file with this id (and of this tenant when given), or None."""
    row = session.get(StoredFile, file_id)
    if row is None or (tenant is not None and row.tenant != tenant):
        return None
    return row


def list_files(*, session: Session, tenant: str, limit: int = 100) -> list[StoredFile]:
    """A tenant's files, newest first."""
    stmt = (
        select(StoredFile)
        .where(StoredFile.tenant == tenant)
        .order_by(StoredFile.created_at.desc(), StoredFile.id)
        .limit(limit)
    )
    return list(session.scalars(stmt))


def _in_use_by_open_batch() -> Exists:
    return exists().where(
        Batch.input_file_id == StoredFile.id, Batch.status.in_(OPEN_BATCH_STATUSES)
    )


def open_batch_using(*, session: Session, file_id: str) -> str | None:
    """The id of a batch not yet ended whose input is ``file_id``, or None."""
    stmt = (
        select(Batch.id)
        .where(Batch.input_file_id == file_id, Batch.status.in_(OPEN_BATCH_STATUSES))
        .limit(1)
    )
    return session.scalar(stmt)


def delete_file(*, session: Session, file_id: str) -> str | None:
    """Delete the file's row (the caller commits, then removes the bytes at the returned
    path); None when it was already gone."""
    row = session.get(StoredFile, file_id)
    if row is None:
        return None
    path = row.path
    session.execute(delete(StoredFile).where(StoredFile.id == file_id))
    return path


def expired_files(
    *, session: Session, now: datetime | None = None, limit: int = 500
) -> list[tuple[str, str]]:
    """(id, tenant) of up to ``limit`` files past their ``expires_at``, soonest expired
    first, leaving out files an open batch reads as its input (kept until it ends)."""
    stmt = (
        select(StoredFile.id, StoredFile.tenant)
        .where(
            StoredFile.expires_at.is_not(None),
            StoredFile.expires_at <= (now or utcnow()),
            ~_in_use_by_open_batch(),
        )
        .order_by(StoredFile.expires_at, StoredFile.id)
        .limit(limit)
    )
    return [(r[0], r[1]) for r in session.execute(stmt)]
