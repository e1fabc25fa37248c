"""Data access for ``GET /v1/models`` and ``inflight models``: the models served by the
live workers (not stopped, heartbeat within the worker timeout), from the ``workers`` rows
each worker writes when it registers; and which models were served recently, for the
submission path's model rules (``api.control.models``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from worker.store.base import utcnow
from worker.store.crud.workers import live_workers
from worker.store.models import Worker, WorkerStatus


@dataclass
class ServedModel:
    """One model id and the live workers serving it. Where those workers disagree, a text
    field lists their values (sorted, joined by ", ") and ``max_model_len`` is the smallest,
    so a request within it fits every one of them."""

    id: str
    model_type: str | None
    architecture: str | None
    dtype: str | None
    max_model_len: int | None
    created: datetime  # the earliest start among its live workers
    last_seen: datetime  # their latest heartbeat
    workers: list[str] = field(default_factory=list)  # worker ids, sorted


def _joined(values: list[str | None]) -> str | None:
    distinct = sorted({v for v in values if v})
    return ", ".join(distinct) if distinct else None


def _served(model_id: str, rows: list[Worker]) -> ServedModel:
    lengths = [w.max_model_len for w in rows if w.max_model_len is not None]
    return ServedModel(
        id=model_id,
        model_type=_joined([w.model_type for w in rows]),
        architecture=_joined([w.architecture for w in rows]),
        dtype=_joined([w.dtype for w in rows]),
        max_model_len=min(lengths) if lengths else None,
        created=min(w.started_at for w in rows),
        last_seen=max(w.heartbeat_at for w in rows),
        workers=sorted(w.id for w in rows),
    )


def served_models(
    *, session: Session, within: timedelta, now: datetime | None = None
) -> list[ServedModel]:
    """Every model a live worker serves, by id (a worker registered before revision 0008
    counts under its ``--model`` spec)."""
    groups: dict[str, list[Worker]] = {}
    for w in live_workers(session=session, within=within, now=now):
        groups.setdefault(w.model_id or w.model, []).append(w)
    return [_served(model_id, rows) for model_id, rows in sorted(groups.items())]


def served_model(
    *, session: Session, model_id: str, within: timedelta, now: datetime | None = None
) -> ServedModel | None:
    """The model ``model_id`` if a live worker serves it, else None."""
    found = [m for m in served_models(session=session, within=within, now=now) if m.id == model_id]
    return found[0] if found else None


@dataclass
class ModelsSeen:
    """The model ids of the workers that beat recently: ``live`` (not stopped, beat within
    the worker timeout) and ``recent`` (any status, beat within the longer window; live
    ones included)."""

    live: set[str] = field(default_factory=set)
    recent: set[str] = field(default_factory=set)


def models_seen(
    *, session: Session, live_within: timedelta, recent_within: timedelta,
    now: datetime | None = None,
) -> ModelsSeen:
    """Which models the live workers serve, and which any worker served within
    ``recent_within`` (a worker registered before revision 0008 counts under its spec)."""
    now = now or utcnow()
    rows = session.execute(
        select(Worker.model_id, Worker.model, Worker.status, Worker.heartbeat_at)
        .where(Worker.heartbeat_at >= now - max(recent_within, live_within))
    )
    seen = ModelsSeen()
    for model_id, spec, status, beat in rows:
        model = model_id or spec
        if beat >= now - recent_within:
            seen.recent.add(model)
        if beat >= now - live_within and status != WorkerStatus.STOPPED.value:
            seen.live.add(model)
    seen.recent |= seen.live
    return seen
