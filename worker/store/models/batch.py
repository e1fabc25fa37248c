"""The ``batches`` table: an OpenAI Batch object."""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Any

from sqlalchemy import JSON, Float, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from worker.store.base import Base, UTCDateTime, utcnow


class BatchStatus(str, Enum):
    """The OpenAI Batch statuses."""

    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


class Batch(Base):
    """A batch of jobs submitted as one JSONL file (OpenAI Batch API shape)."""

    __tablename__ = "batches"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128), default="default")
    endpoint: Mapped[str] = mapped_column(String(64), default="/v1/chat/completions")
    # the model every line runs on (its first line's, or the deployment's default); NULL on
    # batches older than revision 0014, whose lines' model is found again from the file
    model: Mapped[str | None] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(16), default=BatchStatus.VALIDATING.value)
    completion_window: Mapped[str] = mapped_column(String(16), default="24h")
    input_file_id: Mapped[str | None] = mapped_column(String(64))
    output_file_id: Mapped[str | None] = mapped_column(String(64))
    error_file_id: Mapped[str | None] = mapped_column(String(64))
    request_total: Mapped[int] = mapped_column(Integer, default=0)
    request_completed: Mapped[int] = mapped_column(Integer, default=0)
    request_failed: Mapped[int] = mapped_column(Integer, default=0)
    errors: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    in_progress_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finalizing_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    failed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    expired_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    cancelling_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    cancelled_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # seconds after their creation the output and error files expire (None: kept)
    output_expires_after: Mapped[int | None] = mapped_column(Integer)
    # the batch whose failed and expired lines this one re-runs (POST .../retry)
    retry_of: Mapped[str | None] = mapped_column(String(64))
    # the Idempotency-Key the batch was created with (unique per tenant) and the SHA-256 of
    # its request, so a repeat answers this batch and the same key with another request is
    # refused
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_digest: Mapped[str | None] = mapped_column(String(64))
    # migration 0015. The estimate made at creation (api/control/estimate.py: prompt and
    # output tokens, engine-seconds, the completion time), and the completion time as the
    # beat re-estimates it while the batch runs
    estimate: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    estimated_engine_seconds: Mapped[float | None] = mapped_column(Float)
    estimated_completion_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # the OpenAI usage of the batch's jobs, written when it is finalized (read live before)
    usage: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # the batch's event (batch.completed, .failed, .expired, .cancelled) POSTed here when it
    # ends: none (no URL) | waiting (not ended) | pending | delivered | failed, attempts,
    # the next try (or the delivering claimer's lease expiry, with its holder), last error
    callback_url: Mapped[str | None] = mapped_column(String(2048))
    webhook_state: Mapped[str] = mapped_column(String(16), default="none", server_default="none")
    webhook_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    webhook_next_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    webhook_error: Mapped[str | None] = mapped_column(Text)
    webhook_holder: Mapped[str | None] = mapped_column(String(64))

    __table_args__ = (
        Index(None, "tenant", "created_at"),
        UniqueConstraint("tenant", "idempotency_key"),
        Index(None, "webhook_state", "webhook_next_at"),
    )
