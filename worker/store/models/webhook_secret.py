"""The ``webhook_secrets`` table: the key each tenant's webhook deliveries are signed with."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from worker.store.base import Base, UTCDateTime, utcnow


class WebhookSecret(Base):
    """One tenant's HMAC-SHA256 signing secret (created on first use, rotatable)."""

    __tablename__ = "webhook_secrets"

    tenant: Mapped[str] = mapped_column(String(128), primary_key=True)
    secret: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
