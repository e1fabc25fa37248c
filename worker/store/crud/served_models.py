"""Data access for ``GET /v1/models`` and ``inflight models``: the models served by the
live workers (not stopped, heartbeat within the worker timeout), from the ``workers`` rows
each worker writes when it registers."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from worker.store.crud.workers import live_workers
from worker.store.models import Worker


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
