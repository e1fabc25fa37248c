"""The ``api_jobs`` table: what the API keeps about a job beyond the ``jobs`` row:
idempotency key and webhook delivery state."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from worker.store.base import Base, UTCDateTime


class ApiJob(Base):
    """API-side state of one job (keyed by job id)."""

    __tablename__ = "api_jobs"

    job_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128))
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    body_hash: Mapped[str | None] = mapped_column(String(64))
    callback_url: Mapped[str | None] = mapped_column(String(2048))
    # webhook: none | pending | delivered | failed
    webhook_state: Mapped[str] = mapped_column(String(16), default="none")
    webhook_attempts: Mapped[int] = mapped_column(Integer, default=0)
    webhook_next_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    webhook_error: Mapped[str | None] = mapped_column(Text)
    # the claimer delivering it now; webhook_next_at is then its lease's expiry
    webhook_holder: Mapped[str | None] = mapped_column(String(64))

    __table_args__ = (
        UniqueConstraint("tenant", "idempotency_key"),
        Index(None, "webhook_state", "webhook_next_at"),
    )
