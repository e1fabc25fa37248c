"""The ``files`` table: uploaded batch input files and generated output/error files."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from worker.store.base import Base, UTCDateTime, utcnow


class StoredFile(Base):
    """A file in the API's storage (OpenAI File object); ``path`` is where its bytes are."""

    __tablename__ = "files"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128))
    purpose: Mapped[str] = mapped_column(String(32))
    filename: Mapped[str] = mapped_column(String(512))
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    path: Mapped[str] = mapped_column(String(1024))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # when the retention task deletes it (OpenAI's expires_after; a batch's
    # output_expires_after for its output and error files); None: kept until deleted
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (Index(None, "tenant", "created_at"), Index(None, "expires_at"))
