"""The ``workers`` table: one row per worker process, kept alive by its heartbeat."""

from __future__ import annotations

from datetime import datetime
from enum import Enum

from sqlalchemy import Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from worker.store.base import Base, UTCDateTime, utcnow


class WorkerStatus(str, Enum):
    """What a worker says it is doing."""

    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"


class Worker(Base):
    """A worker process: where it runs, which model, and when it last said it was alive."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int | None] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(String(255))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    status: Mapped[str] = mapped_column(String(16), default=WorkerStatus.STARTING.value)
