"""Producer: commit the job rows first, then XADD one message per job."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import redis
from sqlalchemy.orm import Session, sessionmaker

from worker.queue.keys import QueueKeys
from worker.queue.message import JobMessage
from worker.store.crud.jobs import create_jobs, new_job_id
from worker.store.schemas import NewJob
from worker.telemetry.enqueue_spans import EnqueuedJob, enqueue_spans

log = logging.getLogger(__name__)


def publish(
    *, redis_client: redis.Redis, keys: QueueKeys, messages: Sequence[tuple[str, JobMessage]]
) -> list[str]:
    """XADD ``(queue_class, message)`` pairs in one pipeline; returns the entry ids."""
    if not messages:
        return []
    pipe = redis_client.pipeline(transaction=False)
    for queue_class, msg in messages:
        pipe.xadd(keys.stream(queue_class), msg.encode())  # type: ignore[arg-type]
    return [str(x) for x in pipe.execute()]


def enqueue(
    *,
    session_factory: sessionmaker[Session],
    redis_client: redis.Redis,
    keys: QueueKeys,
    jobs: Sequence[NewJob],
    traceparent: str | None = None,
    skip_existing: bool = False,
) -> list[str]:
    """Insert the jobs (one transaction, committed) and then publish them; returns job ids.

    If publishing fails after the commit the jobs stay queued in SQL and the reconciler
    publishes them later; the error is re-raised so the caller knows. With
    ``skip_existing`` a job whose id is already stored is neither inserted nor published
    again (a re-run of an interrupted producer); only the new ids are returned.

    With tracing on, each job gets an ``inflight.enqueue`` span (child of ``traceparent``
    or of the current span, else the root of the job's own trace) whose context its message
    carries; with tracing off the messages carry ``traceparent`` as given.
    """
    for job in jobs:
        keys.stream(job.queue_class)  # validate before writing anything
        job.id = job.id or new_job_id()  # known before the commit, for the spans
    spans = [EnqueuedJob(j.id, j.queue_class, j.tenant, j.priority) for j in jobs]
    with enqueue_spans(spans, traceparent=traceparent) as traceparents:
        with session_factory.begin() as session:
            ids = create_jobs(session=session, jobs=jobs, skip_existing=skip_existing)
        fresh = set(ids)
        msgs = [
            (
                job.queue_class,
                JobMessage(
                    job_id=job.id,
                    body=job.request,
                    tenant=job.tenant,
                    priority=job.priority,
                    traceparent=traceparents.get(job.id),
                ),
            )
            for job in jobs
            if job.id in fresh
        ]
        try:
            publish(redis_client=redis_client, keys=keys, messages=msgs)
        except redis.RedisError:
            log.warning(
                "committed %d jobs but could not publish them; the reconciler will", len(ids)
            )
            raise
    return ids
