"""The ``batch_progress`` table: the API's bookkeeping while it expands and finalizes a batch."""

from __future__ import annotations

from sqlalchemy import Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from worker.store.base import Base


class BatchProgress(Base):
    """How far a batch's input file was read, and how many of its lines were invalid."""

    __tablename__ = "batch_progress"

    batch_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    lines_read: Mapped[int] = mapped_column(Integer, default=0)
    invalid_lines: Mapped[int] = mapped_column(Integer, default=0)
    expanded: Mapped[int] = mapped_column(Integer, default=0)  # 1 once every line is in
