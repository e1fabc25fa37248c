"""Data access for ``workers``: register, heartbeat, status, liveness."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, select, update
from sqlalchemy.orm import Session

from worker.store.base import utcnow
from worker.store.models import Worker, WorkerStatus
from worker.store.schemas import ModelInfo


def register_worker(
    *,
    session: Session,
    worker_id: str,
    host: str,
    model: str,
    pid: int | None,
    info: ModelInfo | None = None,
) -> Worker:
    """Insert (or refresh) this worker's row with status ``starting``, with what it serves
    (``info``; without it the model id is ``model`` and the rest unknown)."""
    now = utcnow()
    row = session.get(Worker, worker_id)
    if row is None:
        row = Worker(id=worker_id, host=host, model=model, pid=pid, started_at=now)
        session.add(row)
    row.host, row.model, row.pid = host, model, pid
    info = info or ModelInfo(model_id=model)
    row.model_id, row.model_type, row.architecture = info.model_id, info.model_type, info.architecture
    row.dtype, row.max_model_len = info.dtype, info.max_model_len
    row.started_at = row.heartbeat_at = now
    row.status = WorkerStatus.STARTING.value
    return row


def heartbeat(*, session: Session, worker_id: str, status: str | None = None) -> None:
    """Stamp the worker as alive now (and optionally change its status)."""
    values: dict[str, object] = {"heartbeat_at": utcnow()}
    if status:
        values["status"] = status
    session.execute(update(Worker).where(Worker.id == worker_id).values(**values))


def _live(within: timedelta, now: datetime | None = None) -> ColumnElement[bool]:
    """The liveness test: not stopped, and beat within ``within`` before ``now``."""
    since: datetime = (now or utcnow()) - within
    return (Worker.heartbeat_at >= since) & (Worker.status != WorkerStatus.STOPPED.value)


def live_worker_ids(*, session: Session, within: timedelta, model: str | None = None) -> set[str]:
    """Ids of workers that are not stopped and beat within ``within`` (serving ``model``,
    when named)."""
    query = select(Worker.id).where(_live(within))
    if model is not None:
        query = query.where(Worker.model_id == model)
    return set(session.scalars(query))


def live_workers(
    *, session: Session, within: timedelta, now: datetime | None = None
) -> list[Worker]:
    """The rows of the workers that are not stopped and beat within ``within`` before
    ``now``, by id."""
    return list(session.scalars(select(Worker).where(_live(within, now)).order_by(Worker.id)))


def list_workers(*, session: Session) -> list[Worker]:
    """All workers, latest heartbeat first."""
    return list(session.scalars(select(Worker).order_by(Worker.heartbeat_at.desc())))
