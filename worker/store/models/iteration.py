"""The ``iterations`` table: one row per engine step per worker (the StepStats)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Float, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from worker.store.base import Base, UTCDateTime


class Iteration(Base):
    """One engine step. Jobs whose ``[first_step, last_step]`` on the same worker
    contains ``step`` were in that step's batch."""

    __tablename__ = "iterations"

    worker_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    time: Mapped[datetime] = mapped_column(UTCDateTime)
    num_running: Mapped[int] = mapped_column(Integer)
    num_waiting: Mapped[int] = mapped_column(Integer)
    num_prefill_tokens: Mapped[int] = mapped_column(Integer)
    num_decode_tokens: Mapped[int] = mapped_column(Integer)
    kv_blocks_used: Mapped[int] = mapped_column(Integer)
    kv_blocks_total: Mapped[int] = mapped_column(Integer)
    num_preemptions: Mapped[int] = mapped_column(Integer)
    num_admitted: Mapped[int] = mapped_column(Integer)
    num_finished: Mapped[int] = mapped_column(Integer)
    schedule_ms: Mapped[float] = mapped_column(Float)
    forward_ms: Mapped[float] = mapped_column(Float)
    sample_ms: Mapped[float] = mapped_column(Float)
    # service classes (migration 0010; None on older rows): interactive sequences running
    # and waiting after the step, and the rows they computed; the others were batch
    num_running_interactive: Mapped[int | None] = mapped_column(Integer, nullable=True)
    num_waiting_interactive: Mapped[int | None] = mapped_column(Integer, nullable=True)
    num_interactive_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # how long the step's forward was paused while interjected steps of interactive
    # arrivals ran (migration 0018; None on older rows); not in forward_ms
    paused_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
