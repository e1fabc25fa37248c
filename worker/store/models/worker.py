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
    """A worker process: where it runs, which model it serves (as it registered it, from
    its built engine), and when it last said it was alive."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int | None] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(String(255))  # the --model spec it was started with
    # What it serves (``GET /v1/models``), written at registration; NULL for rows of workers
    # older than revision 0008, and (all but model_id) for engines that do not say.
    model_id: Mapped[str | None] = mapped_column(String(255))  # the spec, or a path's name
    model_type: Mapped[str | None] = mapped_column(String(64))  # config.model_type
    architecture: Mapped[str | None] = mapped_column(String(255))  # config.architectures[0]
    dtype: Mapped[str | None] = mapped_column(String(32))  # e.g. float32
    max_model_len: Mapped[int | None] = mapped_column(Integer)  # the engine's context
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    status: Mapped[str] = mapped_column(String(16), default=WorkerStatus.STARTING.value)
