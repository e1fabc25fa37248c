"""Usage: what jobs consumed (tokens, prompt tokens the prefix cache served, engine-seconds),
summed per batch, per tenant, per day, over the jobs that ended in a time range.

A job's usage is written with its result (``worker.jobs.finish``), so these are plain SUMs
over ``jobs``; a batch's are also kept on the batch when it is finalized, so they outlive
the retention of its job rows."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from worker.store.models import Job

GROUPS = ("batch", "day")  # what GET /v1/usage may group by, beyond the tenant


@dataclass
class UsageTotals:
    """Sums over some jobs: how many, prompt (input) tokens, of them served from the
    prefix cache, output tokens, engine-seconds."""

    jobs: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    engine_seconds: float = 0.0

    def add(self, job: Job) -> None:
        """Count one job's usage (its unknown parts as 0)."""
        self.jobs += 1
        self.input_tokens += job.prompt_tokens or 0
        self.cached_tokens += job.cached_tokens or 0
        self.output_tokens += job.completion_tokens or 0
        self.engine_seconds += job.engine_seconds or 0.0

    def as_dict(self) -> dict[str, Any]:
        """The sums as stored on a finalized batch (``batches.usage``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, stored: dict[str, Any]) -> UsageTotals:
        """The sums a finalized batch stored."""
        return cls(**{k: stored.get(k, 0) for k in ("jobs", "input_tokens", "cached_tokens",
                                                     "output_tokens", "engine_seconds")})


def _sums() -> list[ColumnElement[Any]]:
    return [
        func.count(),
        func.coalesce(func.sum(Job.prompt_tokens), 0),
        func.coalesce(func.sum(Job.cached_tokens), 0),
        func.coalesce(func.sum(Job.completion_tokens), 0),
        func.coalesce(func.sum(Job.engine_seconds), 0.0),
    ]


def _totals(row: Any) -> UsageTotals:
    return UsageTotals(int(row[0]), int(row[1]), int(row[2]), int(row[3]), float(row[4]))


def batch_usage(*, session: Session, batch_id: str) -> UsageTotals:
    """The usage of a batch's jobs as of now (those still open count what is known: 0)."""
    row = session.execute(select(*_sums()).where(Job.batch_id == batch_id)).one()
    return _totals(row)


def _day(session: Session) -> ColumnElement[Any]:
    """The UTC calendar day a job ended, as ``YYYY-MM-DD`` text on every backend."""
    if session.get_bind().dialect.name == "postgresql":
        return func.to_char(func.timezone("UTC", Job.finished_at), "YYYY-MM-DD")
    return func.strftime("%Y-%m-%d", Job.finished_at)  # SQLite stores UTC, naive


def usage_rows(
    *,
    session: Session,
    start: datetime | None = None,
    end: datetime | None = None,
    tenant: str | None = None,
    group_by: str | None = None,
) -> list[tuple[dict[str, Any], UsageTotals]]:
    """Usage of the jobs that ended in ``[start, end)`` (None: unbounded): of ``tenant`` (None: every tenant,
    one group per tenant), in one group, or one per batch (``batch_id`` None for jobs
    submitted alone) or per UTC day. Each row is (the group's keys, its sums), ordered by
    the keys; ungrouped, one row (zeros when no job ended in the range)."""
    keys: list[tuple[str, ColumnElement[Any]]] = []
    if tenant is None:
        keys.append(("tenant", Job.tenant))  # type: ignore[arg-type]
    if group_by == "batch":
        keys.append(("batch_id", Job.batch_id))  # type: ignore[arg-type]
    elif group_by == "day":
        keys.append(("day", _day(session)))
    elif group_by is not None:
        raise ValueError(f"group_by={group_by!r}: expected one of {GROUPS}")
    where: list[ColumnElement[bool]] = [Job.finished_at.is_not(None)]
    if start is not None:
        where.append(Job.finished_at >= start)
    if end is not None:
        where.append(Job.finished_at < end)
    if tenant is not None:
        where.append(Job.tenant == tenant)
    cols = [c for _, c in keys]
    stmt = select(*cols, *_sums()).where(*where)
    if cols:
        stmt = stmt.group_by(*cols).order_by(*cols)
    n = len(cols)
    return [({name: row[i] for i, (name, _) in enumerate(keys)}, _totals(row[n:]))
            for row in session.execute(stmt)]
