"""Data access for ``files``: create, read (per tenant), list."""

from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.orm import Session

from worker.store.base import utcnow
from worker.store.models import StoredFile


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
) -> StoredFile:
    """Add a file row (the caller has written the bytes and commits)."""
    row = StoredFile(
        id=file_id,
        tenant=tenant,
        purpose=purpose,
        filename=filename,
        bytes=size,
        path=path,
        created_at=utcnow(),
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
