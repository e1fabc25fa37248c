"""Retention: delete old engine iteration rows."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete
from sqlalchemy.orm import Session

from worker.store.models import Iteration


def prune_iterations(*, session: Session, older_than: datetime) -> int:
    """Delete iteration rows recorded before ``older_than``; returns how many."""
    res = session.execute(delete(Iteration).where(Iteration.time < older_than))
    return int(res.rowcount)  # type: ignore[attr-defined]
