"""Data access for ``iterations``: bulk insert of step traces, and the batch-mates query."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session

from worker.store.models import Iteration


def insert_iterations(
    *, session: Session, rows: Sequence[dict[str, Any]], ignore_conflicts: bool = False
) -> None:
    """Bulk-insert step rows (dicts with the Iteration column names) in one statement.

    With ``ignore_conflicts`` rows whose (worker_id, step) already exist are skipped, so a
    retried transaction that had in fact committed does not fail."""
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    if ignore_conflicts and dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        session.execute(pg_insert(Iteration).on_conflict_do_nothing(), list(rows))
    elif ignore_conflicts and dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        session.execute(sqlite_insert(Iteration).on_conflict_do_nothing(), list(rows))
    else:
        session.execute(insert(Iteration), list(rows))
