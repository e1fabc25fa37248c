"""The ``batch_progress`` table: the API's bookkeeping while it expands and finalizes a batch."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from worker.store.base import Base, UTCDateTime


class BatchProgress(Base):
    """How far a batch's input file was read, and how many of its lines were invalid.

    ``lines_read`` commits in the same transaction as the jobs of the lines it covers, so a
    resumed expansion starts exactly after the last committed chunk. ``lease_owner`` /
    ``lease_until`` tell a live expansion (renewed at each chunk) from a dead one;
    ``expand_attempts`` / ``finalize_attempts`` bound how often either is tried."""

    __tablename__ = "batch_progress"

    batch_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    lines_read: Mapped[int] = mapped_column(Integer, default=0)
    invalid_lines: Mapped[int] = mapped_column(Integer, default=0)
    expanded: Mapped[int] = mapped_column(Integer, default=0)  # 1 once every line is in
    lease_owner: Mapped[str | None] = mapped_column(String(128))  # the expanding process
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime)  # dead after this
    # expansion runs that claimed the batch since its last committed chunk, and finalize
    # runs that began writing its files: each bounded (see the settings' *_max_attempts)
    expand_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    finalize_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
