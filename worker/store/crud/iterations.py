"""Data access for ``iterations``: bulk insert of step traces, and the batch-mates query."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import and_, insert, select
from sqlalchemy.orm import Session

from worker.store.models import Iteration, Job


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


def iterations_of_job(*, session: Session, job_id: str) -> list[Iteration]:
    """The engine steps a job took part in (on the worker that finished it)."""
    job = session.get(Job, job_id)
    if job is None or job.worker_id is None or job.first_step is None or job.last_step is None:
        return []
    stmt = (
        select(Iteration)
        .where(
            Iteration.worker_id == job.worker_id,
            Iteration.step >= job.first_step,
            Iteration.step <= job.last_step,
        )
        .order_by(Iteration.step)
    )
    return list(session.scalars(stmt))


def batch_mates(*, session: Session, job_id: str) -> list[Job]:
    """Other jobs whose step range on the same worker overlaps this job's: what else was in
    the batch while it ran."""
    job = session.get(Job, job_id)
    if job is None or job.worker_id is None or job.first_step is None or job.last_step is None:
        return []
    stmt = select(Job).where(
        and_(
            Job.worker_id == job.worker_id,
            Job.id != job.id,
            Job.first_step <= job.last_step,
            Job.last_step >= job.first_step,
        )
    )
    return list(session.scalars(stmt))
