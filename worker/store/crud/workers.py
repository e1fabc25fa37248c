"""Data access for ``workers``: register, heartbeat, status, liveness."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from worker.store.base import utcnow
from worker.store.models import Worker, WorkerStatus


def register_worker(
    *, session: Session, worker_id: str, host: str, model: str, pid: int | None
) -> Worker:
    """Insert (or refresh) this worker's row with status ``starting``."""
    now = utcnow()
    row = session.get(Worker, worker_id)
    if row is None:
        row = Worker(id=worker_id, host=host, model=model, pid=pid, started_at=now)
        session.add(row)
    row.host, row.model, row.pid = host, model, pid
    row.started_at = row.heartbeat_at = now
    row.status = WorkerStatus.STARTING.value
    return row


def heartbeat(*, session: Session, worker_id: str, status: str | None = None) -> None:
    """Stamp the worker as alive now (and optionally change its status)."""
    values: dict[str, object] = {"heartbeat_at": utcnow()}
    if status:
        values["status"] = status
    session.execute(update(Worker).where(Worker.id == worker_id).values(**values))


def live_worker_ids(*, session: Session, within: timedelta) -> set[str]:
    """Ids of workers that are not stopped and beat within ``within``."""
    since: datetime = utcnow() - within
    stmt = select(Worker.id).where(
        Worker.heartbeat_at >= since, Worker.status != WorkerStatus.STOPPED.value
    )
    return set(session.scalars(stmt))


def list_workers(*, session: Session) -> list[Worker]:
    """All workers, latest heartbeat first."""
    return list(session.scalars(select(Worker).order_by(Worker.heartbeat_at.desc())))
