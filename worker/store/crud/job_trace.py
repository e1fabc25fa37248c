"""Data access for ``inflight trace``: one job's timeline, and what else was in its batch
while it waited, prefilled and decoded.

A job row carries the worker that ran it and its first and last engine step; the
``iterations`` table has one row per engine step per worker. A job's steps split into
phases:

- ``queue``: steps of its worker that started after the job was queued and before its
  first step (what the worker was busy with while the job waited);
- ``prefill``: its first step up to the step that produced its first token (the last step
  that started before ``first_token_at``; several with chunked prefill);
- ``decode``: the steps after that, up to its last step.

A job still running has no step range yet (the worker writes it with the result); its
``running`` phase is then every step of its worker since it was picked up. Aggregates are
computed in SQL, so a long job does not pull its rows into memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from worker.store.models import Iteration, Job, JobStatus

# a step row that started this long before the job was queued cannot be the job's (worker
# ids carry a per-process suffix, so this means clock skew between hosts or rows written
# under a worker id reused by hand)
_CLOCK_SLACK = timedelta(seconds=1)


@dataclass
class OverlappingJob:
    """Another job whose step range on the same worker overlaps a phase."""

    id: str
    status: str
    first_step: int
    last_step: int
    prompt_tokens: int | None
    completion_tokens: int | None

    @property
    def steps(self) -> int:
        """How many engine steps the other job spanned in all."""
        return self.last_step - self.first_step + 1


@dataclass
class PhaseStats:
    """The batch around a job during one phase: step aggregates and the jobs it shared the
    batch with. Step fields are None when the phase has no iterations rows."""

    name: str
    first_step: int | None = None
    last_step: int | None = None
    start: datetime | None = None  # start time of the first step row
    end: datetime | None = None  # start time of the last step row
    steps: int = 0  # iterations rows found in [first_step, last_step]
    mean_running: float | None = None
    max_running: int | None = None
    mean_waiting: float | None = None
    max_waiting: int | None = None
    mean_kv_used: float | None = None
    max_kv_used: int | None = None
    kv_total: int | None = None
    preemptions: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    mean_step_ms: float | None = None  # schedule + forward + sample
    max_step_ms: float | None = None
    overlapping: int = 0  # other jobs whose step range overlaps this phase
    longest: list[OverlappingJob] = field(default_factory=list)

    @property
    def mean_kv_use(self) -> float | None:
        """Mean KV blocks used as a fraction of the pool, or None."""
        if self.mean_kv_used is None or not self.kv_total:
            return None
        return self.mean_kv_used / self.kv_total

    @property
    def max_kv_use(self) -> float | None:
        """Peak KV blocks used as a fraction of the pool, or None."""
        if self.max_kv_used is None or not self.kv_total:
            return None
        return self.max_kv_used / self.kv_total


@dataclass
class JobTrace:
    """A job's timeline, derived latencies and per-phase batch statistics."""

    id: str
    status: str
    worker_id: str | None
    attempts: int
    error: str | None
    isolation: str | None
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    queued_at: datetime | None
    started_at: datetime | None
    first_token_at: datetime | None
    finished_at: datetime | None
    first_step: int | None
    last_step: int | None
    phases: list[PhaseStats] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def started(self) -> bool:
        """Whether a worker picked the job up."""
        return self.started_at is not None

    @property
    def queue_wait_s(self) -> float | None:
        """Queued to started, in seconds."""
        return _seconds(self.queued_at, self.started_at)

    @property
    def ttft_s(self) -> float | None:
        """Time to first token: queued to first token, in seconds."""
        return _seconds(self.queued_at, self.first_token_at)

    @property
    def prefill_s(self) -> float | None:
        """Started to first token, in seconds."""
        return _seconds(self.started_at, self.first_token_at)

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first, in seconds (None under two tokens)."""
        decode = _seconds(self.first_token_at, self.finished_at)
        if decode is None or not self.completion_tokens or self.completion_tokens < 2:
            return None
        return decode / (self.completion_tokens - 1)

    @property
    def e2e_s(self) -> float | None:
        """End to end: queued to finished, in seconds."""
        return _seconds(self.queued_at, self.finished_at)

    def phase(self, name: str) -> PhaseStats | None:
        """The phase called ``name``, if the trace has it."""
        return next((p for p in self.phases if p.name == name), None)


def _seconds(a: datetime | None, b: datetime | None) -> float | None:
    if a is None or b is None:
        return None
    return (b - a).total_seconds()


def _num(value: Any) -> float | None:
    return None if value is None else float(value)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def phase_stats(
    *,
    session: Session,
    name: str,
    worker_id: str,
    first_step: int | None,
    last_step: int | None,
    exclude_job_id: str | None = None,
    longest: int = 5,
) -> PhaseStats:
    """Aggregate the iterations rows of ``worker_id`` in ``[first_step, last_step]`` and
    find the other jobs (not ``exclude_job_id``) whose step range there overlaps it; the
    ``longest`` of them, by steps spanned, are listed. An empty range gives an empty phase."""
    stats = PhaseStats(name=name, first_step=first_step, last_step=last_step)
    if first_step is None or last_step is None or last_step < first_step:
        return stats
    step_ms = Iteration.schedule_ms + Iteration.forward_ms + Iteration.sample_ms
    in_range = (
        Iteration.worker_id == worker_id,
        Iteration.step >= first_step,
        Iteration.step <= last_step,
    )
    row = session.execute(
        select(
            func.count(),
            func.avg(Iteration.num_running),
            func.max(Iteration.num_running),
            func.avg(Iteration.num_waiting),
            func.max(Iteration.num_waiting),
            func.avg(Iteration.kv_blocks_used),
            func.max(Iteration.kv_blocks_used),
            func.max(Iteration.kv_blocks_total),
            func.coalesce(func.sum(Iteration.num_preemptions), 0),
            func.coalesce(func.sum(Iteration.num_prefill_tokens), 0),
            func.coalesce(func.sum(Iteration.num_decode_tokens), 0),
            func.avg(step_ms),
            func.max(step_ms),
        ).where(*in_range)
    ).one()
    stats.steps = int(row[0])
    if stats.steps:
        # min/max of a TypeDecorator column come back raw on SQLite: read the times typed
        stats.start = session.scalar(
            select(Iteration.time).where(*in_range).order_by(Iteration.step).limit(1)
        )
        stats.end = session.scalar(
            select(Iteration.time).where(*in_range).order_by(Iteration.step.desc()).limit(1)
        )
        stats.mean_running, stats.max_running = _num(row[1]), _int(row[2])
        stats.mean_waiting, stats.max_waiting = _num(row[3]), _int(row[4])
        stats.mean_kv_used, stats.max_kv_used = _num(row[5]), _int(row[6])
        stats.kv_total = _int(row[7])
        stats.preemptions = int(row[8])
        stats.prefill_tokens, stats.decode_tokens = int(row[9]), int(row[10])
        stats.mean_step_ms, stats.max_step_ms = _num(row[11]), _num(row[12])
    overlap = (
        Job.worker_id == worker_id,
        Job.first_step <= last_step,
        Job.last_step >= first_step,
        *((Job.id != exclude_job_id,) if exclude_job_id else ()),
    )
    stats.overlapping = int(
        session.scalar(select(func.count()).select_from(Job).where(*overlap)) or 0
    )
    if stats.overlapping and longest > 0:
        rows = session.execute(
            select(
                Job.id, Job.status, Job.first_step, Job.last_step, Job.prompt_tokens,
                Job.completion_tokens,
            )
            .where(*overlap)
            .order_by((Job.last_step - Job.first_step).desc(), Job.id)
            .limit(longest)
        ).all()  # fmt: skip
        stats.longest = [
            OverlappingJob(
                id=r[0], status=r[1], first_step=int(r[2] or 0), last_step=int(r[3] or 0),
                prompt_tokens=r[4], completion_tokens=r[5],
            )  # first_step/last_step are not NULL here: the overlap test compares them
            for r in rows
        ]  # fmt: skip
    return stats


def first_token_step(
    *, session: Session, worker_id: str, first_step: int, last_step: int, first_token_at: datetime
) -> int | None:
    """The step that produced the first token: the last of ``[first_step, last_step]`` that
    started before ``first_token_at`` (the engine stamps the token when the step ends)."""
    return _int(
        session.scalar(
            select(func.max(Iteration.step)).where(
                Iteration.worker_id == worker_id,
                Iteration.step >= first_step,
                Iteration.step <= last_step,
                Iteration.time < first_token_at,
            )
        )
    )


def _step_window(
    *,
    session: Session,
    worker_id: str,
    since: datetime,
    before_step: int | None = None,
    before_time: datetime | None = None,
) -> tuple[int | None, int | None]:
    """First and last step of the worker that started at or after ``since`` and, when a
    bound is given, before ``before_step`` (or, when the step is unknown, before
    ``before_time``). Without a bound: every step since (a job still running)."""
    conds: list[Any] = [Iteration.worker_id == worker_id, Iteration.time >= since]
    if before_step is not None:
        conds.append(Iteration.step < before_step)
    elif before_time is not None:
        conds.append(Iteration.time < before_time)
    row = session.execute(
        select(func.min(Iteration.step), func.max(Iteration.step)).where(*conds)
    ).one()
    return _int(row[0]), _int(row[1])


def job_trace(*, session: Session, job_id: str, longest: int = 5) -> JobTrace | None:
    """The trace of job ``job_id``: its timeline and, per phase (queue, prefill, decode;
    ``running`` while it runs), the batch it was in. None if there is no such job."""
    job = session.get(Job, job_id)
    if job is None:
        return None
    trace = JobTrace(
        id=job.id, status=job.status, worker_id=job.worker_id, attempts=job.attempts,
        error=job.error, isolation=job.isolation, finish_reason=job.finish_reason,
        prompt_tokens=job.prompt_tokens, completion_tokens=job.completion_tokens, queued_at=job.queued_at,
        started_at=job.started_at, first_token_at=job.first_token_at,
        finished_at=job.finished_at, first_step=job.first_step, last_step=job.last_step,
    )  # fmt: skip
    worker = job.worker_id
    if worker is None or job.started_at is None:
        if job.status != JobStatus.QUEUED.value:
            trace.notes.append(f"the job ended ({job.status}) without entering the engine")
        return trace

    def phase(name: str, a: int | None, b: int | None) -> PhaseStats:
        return phase_stats(
            session=session, name=name, worker_id=worker, first_step=a, last_step=b,
            exclude_job_id=job.id, longest=longest,
        )  # fmt: skip

    qa, qb = _step_window(
        session=session, worker_id=worker, since=job.queued_at,
        before_step=job.first_step, before_time=job.started_at,
    )  # fmt: skip
    trace.phases.append(phase("queue", qa, qb))
    if job.first_step is None or job.last_step is None:
        if job.status == JobStatus.RUNNING.value:
            ra, rb = _step_window(session=session, worker_id=worker, since=job.started_at)
            trace.phases.append(phase("running", ra, rb))
            trace.notes.append(
                "still running: the step range is written with the result, so the running "
                "phase is every step of its worker since it was picked up"
            )
        else:
            trace.notes.append(f"the job ended ({job.status}) without entering the engine")
        return trace
    split = None
    if job.first_token_at is not None:
        split = first_token_step(
            session=session, worker_id=worker, first_step=job.first_step,
            last_step=job.last_step, first_token_at=job.first_token_at,
        )  # fmt: skip
    if split is None:  # no first token (or no rows): the whole range counts as prefill
        split = job.last_step
    trace.phases.append(phase("prefill", job.first_step, split))
    trace.phases.append(phase("decode", split + 1, job.last_step))
    own = [p for p in trace.phases if p.name != "queue"]
    if not any(p.steps for p in own):
        trace.notes.append(
            f"no iterations rows for steps {job.first_step}..{job.last_step} of worker "
            f"{worker} (it ran with --no-traces, or retention removed them)"
        )
    starts = [p.start for p in own if p.start is not None]
    if starts and job.queued_at is not None and min(starts) < job.queued_at - _CLOCK_SLACK:
        trace.notes.append(
            "iterations rows of these steps predate the job (clock skew between hosts, or "
            "reused step numbers under one worker id), so the batch figures are not this job's"
        )
    return trace


def iteration_series(
    *, session: Session, worker_id: str, start: datetime, end: datetime, limit: int = 50_000
) -> list[Iteration]:
    """Iterations rows of ``worker_id`` that started in ``[start, end]``, in step order
    (at most ``limit``, the earliest first)."""
    stmt = (
        select(Iteration)
        .where(Iteration.worker_id == worker_id, Iteration.time >= start, Iteration.time <= end)
        .order_by(Iteration.step)
        .limit(limit)
    )
    return list(session.scalars(stmt))
