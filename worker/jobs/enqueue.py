"""Enqueue: commit the job rows first, then publish one stream message per job.

One error policy for every producer (REST, batch expansion, ``inflight enqueue``): the
commit is the enqueue. A Redis failure after it loses nothing (the reconciler publishes
open jobs that no stream carries, :mod:`worker.jobs.republish`); it is logged here once and
raised as :class:`NotPublished`, which carries the committed ids, so each caller can say
what it means for its user. A failure before or during the commit writes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta

import redis
from sqlalchemy.orm import Session, sessionmaker

from worker.queue.keys import QUEUE_CLASSES, QueueKeys
from worker.queue.message import JobMessage
from worker.queue.producer import publish
from worker.queue.slack import DEFAULT_WINDOW_S
from worker.store.base import utcnow
from worker.store.crud.job_status import create_jobs
from worker.store.crud.jobs import new_job_id
from worker.store.models.job import Job, JobStatus
from worker.store.schemas import NewJob
from worker.telemetry.enqueue_spans import EnqueuedJob, enqueue_spans

log = logging.getLogger(__name__)


class NotPublished(redis.RedisError):
    """The jobs are committed (queued in SQL) but Redis refused their messages; the
    reconciler publishes them later. ``job_ids`` are the committed ids."""

    def __init__(self, job_ids: list[str], cause: redis.RedisError) -> None:
        super().__init__(f"{len(job_ids)} jobs committed but not published ({cause})")
        self.job_ids = job_ids


class JobWrite:
    """The open transaction of one enqueue: run the caller's own checks and writes on
    ``session``, and :meth:`insert` the jobs (at most once). Only inserted jobs are
    published, after the commit."""

    def __init__(self, session: Session, jobs: Sequence[NewJob], skip_existing: bool) -> None:
        self.session = session
        self._jobs, self._skip_existing = jobs, skip_existing
        self.inserted: list[str] = []
        self.queued_at = utcnow()

    def insert(self) -> list[str]:
        """Insert the jobs in this transaction; returns the ids inserted (with
        ``skip_existing``, the ids already stored are left out)."""
        self.queued_at = utcnow()
        self.inserted = create_jobs(
            session=self.session,
            jobs=self._jobs,
            now=self.queued_at,
            skip_existing=self._skip_existing,
        )
        return self.inserted

    def insert_rows(self) -> list[Job]:
        """:meth:`insert`, returning the jobs inserted as the rows just written (made from
        the values inserted, not read back; an ORM object per job, so for an answer, not a
        bulk producer): queued at ``queued_at``, no attempt yet."""
        fresh = set(self.insert())
        return [
            Job(
                id=j.id,
                tenant=j.tenant,
                batch_id=j.batch_id,
                custom_id=j.custom_id,
                queue_class=j.queue_class,
                model=j.model,
                status=JobStatus.QUEUED.value,
                priority=j.priority,
                request=j.request,
                queued_at=self.queued_at,
                attempts=0,
                max_tokens=j.max_tokens,
                deadline=j.deadline,
            )
            for j in self._jobs
            if j.id in fresh
        ]


@contextmanager
def enqueuing(
    *,
    session_factory: sessionmaker[Session],
    redis_client: redis.Redis,
    keys: QueueKeys,
    jobs: Sequence[NewJob],
    traceparent: str | None = None,
    skip_existing: bool = False,
) -> Iterator[JobWrite]:
    """Open one transaction for ``jobs``; on a clean exit commit it, then publish the jobs
    the body inserted, each to the streams of its model (raises :class:`NotPublished` if
    Redis refuses). An exception in the body rolls everything back and publishes nothing.
    A job without a model takes ``keys.model`` (ValueError, before anything is written,
    when that names none either). A batch job without a deadline is given one now:
    ``DEFAULT_WINDOW_S`` from now (``worker.queue.slack``); it picks the job's lane. An
    interactive job with a deadline is a ValueError (interactive work is read first, a
    deadline would not change when it runs).

    Each job gets its id now (``job.id`` when set) and, with tracing on, an
    ``inflight.enqueue`` span (child of ``traceparent`` or of the current span) whose
    context its message carries."""
    now = utcnow()
    for job in jobs:
        job.model = job.model or keys.model
        if not job.model:
            raise ValueError("a job names no model, and neither do the queue keys")
        if job.queue_class not in QUEUE_CLASSES:  # validate before any write
            raise ValueError(f"queue class {job.queue_class!r}: expected one of {QUEUE_CLASSES}")
        if job.queue_class == "batch" and job.deadline is None:
            job.deadline = now + timedelta(seconds=DEFAULT_WINDOW_S)
        elif job.queue_class == "interactive" and job.deadline is not None:
            raise ValueError("a deadline is for batch work; interactive jobs are read first")
        job.id = job.id or new_job_id()  # known before the commit, for the spans
    spans = [EnqueuedJob(j.id, j.queue_class, j.tenant, j.priority) for j in jobs]
    with enqueue_spans(spans, traceparent=traceparent) as traceparents:
        with session_factory.begin() as session:
            write = JobWrite(session, jobs, skip_existing)
            yield write
        fresh = set(write.inserted)
        by_model: dict[str, list[tuple[str, JobMessage]]] = {}
        for job in jobs:
            if job.id in fresh:
                message = JobMessage(
                    job_id=job.id,
                    body=job.request,
                    tenant=job.tenant,
                    priority=job.priority,
                    traceparent=traceparents.get(job.id),
                    deadline=job.deadline.timestamp() if job.deadline is not None else None,
                )
                by_model.setdefault(str(job.model), []).append((job.queue_class, message))
        try:
            for model, messages in by_model.items():
                publish(redis_client=redis_client, keys=keys.for_model(model), messages=messages)
        except redis.RedisError as exc:
            log.warning(
                "committed %d jobs but could not publish them all; the reconciler will: %s",
                len(fresh),
                exc,
            )
            raise NotPublished(write.inserted, exc) from exc


def enqueue(
    *,
    session_factory: sessionmaker[Session],
    redis_client: redis.Redis,
    keys: QueueKeys,
    jobs: Sequence[NewJob],
    traceparent: str | None = None,
    skip_existing: bool = False,
) -> list[str]:
    """Insert the jobs (one transaction, committed), then publish them; returns the ids
    inserted. With ``skip_existing`` a job whose id is already stored is neither inserted
    nor published again (a re-run of an interrupted producer). Raises
    :class:`NotPublished` when the commit held and the publish did not."""
    with enqueuing(
        session_factory=session_factory,
        redis_client=redis_client,
        keys=keys,
        jobs=jobs,
        traceparent=traceparent,
        skip_existing=skip_existing,
    ) as write:
        write.insert()
    return write.inserted
