"""The ``jobs`` table: one generation request, its timeline and its result."""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Any

from sqlalchemy import JSON, Float, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from worker.store.base import Base, UTCDateTime, utcnow


class JobStatus(str, Enum):
    """A job's status; which may follow which is ``worker.store.job_lifecycle``."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Job(Base):
    """One generation request. ``request`` is the body as submitted (prompt or messages
    plus sampling fields); the result columns are filled once, when it ends."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128), default="default")
    batch_id: Mapped[str | None] = mapped_column(String(64))
    custom_id: Mapped[str | None] = mapped_column(String(512))
    queue_class: Mapped[str] = mapped_column(String(16), default="batch")
    # the model id it runs on (the stream it is published to, ``model`` in its answers;
    # api.control.models): NULL only on rows older than revision 0014 that no worker's
    # model could be given to
    model: Mapped[str | None] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.QUEUED.value)
    # when batch work is due (migration 0016): its batch's created_at + completion_window, a
    # POST /v1/jobs ``deadline``, else queued_at + 24 h; it picks the job's lane
    # (worker.queue.slack). None on interactive jobs and on rows from before 0016 that no
    # batch gave one
    deadline: Mapped[datetime | None] = mapped_column(UTCDateTime)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    # result
    text: Mapped[str | None] = mapped_column(Text)
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    # timeline
    queued_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    first_token_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # execution
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker_id: Mapped[str | None] = mapped_column(String(128))
    first_step: Mapped[int | None] = mapped_column(Integer)
    last_step: Mapped[int | None] = mapped_column(Integer)
    # why it ran isolated from the normal batch (redelivered after crashes, or bisected
    # after a failed step), with the evidence; None when it ran batched as usual
    isolation: Mapped[str | None] = mapped_column(Text)
    # every sample as the worker produced it (text, finish and stop reason, token ids,
    # logprobs when asked; worker.protocol.openai_output.stored_choice); None on rows
    # written before it existed, which read from text and finish_reason
    choices: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    # a cancel asked for while the job ran: the record a worker honours (Redis only signals)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # when the retention task cleared the request body and result (text, choices, error
    # detail; worker.store.crud.retention), keeping the accounting; None while stored
    result_expired_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # usage beyond the token counts (migration 0015): the output tokens the request allows
    # (max_tokens times n, set at submission; None when it names none), the prompt tokens
    # the prefix cache served (not computed), and the job's engine-seconds: its share of
    # the wall time of every engine step it computed in (worker.engine.step_cost)
    max_tokens: Mapped[int | None] = mapped_column(Integer)
    cached_tokens: Mapped[int | None] = mapped_column(Integer)
    engine_seconds: Mapped[float | None] = mapped_column(Float)

    # The listing (crud.jobs.list_jobs) walks (queued_at, id) with a keyset: no filter (the
    # operator's ``inflight jobs``) and each filter it takes have an index ending in those two
    # columns, so a page is a range scan wherever it starts. The tenant/status and batch ones
    # also serve what the shorter indexes they replaced did (migration 0007): counts per
    # tenant and status, a batch's jobs.
    __table_args__ = (
        Index(None, "status", "queued_at"),
        Index(None, "queued_at", "id"),
        Index(None, "tenant", "queued_at", "id"),
        Index(None, "tenant", "status", "queued_at", "id"),
        Index(None, "batch_id", "queued_at", "id"),
        Index(None, "worker_id", "first_step", "last_step"),
        # retention (migration 0012): results due, then rows due
        Index(None, "result_expired_at", "finished_at"),
        Index(None, "finished_at"),
        # a tenant's usage over a time range, and its recent history (migration 0015)
        Index(None, "tenant", "finished_at"),
    )
