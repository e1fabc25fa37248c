"""The ``api_keys`` table: bearer keys (stored as SHA-256 hashes) mapped to tenants."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, String, false
from sqlalchemy.orm import Mapped, mapped_column

from worker.store.base import Base, UTCDateTime, utcnow


class ApiKey(Base):
    """One API key. Only its hash is stored; ``prefix`` (its first characters) names it."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    name: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # A read-only key may only read (GET); every write answers 403.
    read_only: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
