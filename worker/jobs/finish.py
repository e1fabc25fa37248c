"""Finish: results committed in SQL (one transaction; a job that already ended keeps its
first result), then the entries of those stored acked and their cancel flags cleared in
Redis. A crash between the two leaves the entries pending: redelivered, found ended at
their next start, and only acked.

A result the store refuses (bad data, not an outage) is written alone, and when refused
again stored as a failure with a generic error: the driver's text goes to the log only."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import redis
from sqlalchemy.orm import Session, sessionmaker

from worker.jobs.transient import is_transient
from worker.queue.cancel import clear_cancels
from worker.queue.consumer import ack
from worker.queue.keys import QueueKeys
from worker.store.crud import job_status
from worker.store.schemas import JobResult

T = TypeVar("T")
log = logging.getLogger(__name__)

Entry = tuple[str, str, str | None]
"""A stream entry to ack: (stream, entry id, job id)."""

UNSTORABLE_RESULT_CODE = "result_not_storable"
UNSTORABLE_RESULT_ERROR = (
    f"the result could not be stored (error code {UNSTORABLE_RESULT_CODE}); the job failed "
    "and the worker's log has the detail"
)
"""A job's ``error`` when the store refused its result: never the SQL or driver text."""


class Attempt(Protocol):
    """How the caller runs each step (named ``what``): once, or retried while a store is
    away. Every step of :func:`finish` may be repeated."""

    def __call__(self, fn: Callable[[], T], what: str) -> T: ...


def once(fn: Callable[[], T], what: str) -> T:
    """Run the step once (no retry)."""
    return fn()


def finish(
    *,
    session_factory: sessionmaker[Session],
    redis_client: redis.Redis,
    keys: QueueKeys,
    worker_id: str,
    results: Sequence[JobResult],
    entries: Sequence[Entry] = (),
    skipped: Sequence[Entry] = (),
    also: Callable[[Session], None] | None = None,
    attempt: Attempt = once,
) -> list[JobResult]:
    """Commit ``results`` (with ``also``'s writes in the same transaction: step traces),
    then ack ``entries`` (the results' own) and ``skipped`` (redelivered jobs that had
    already ended), then clear the stored results' cancel flags. Returns the results not
    stored at all: their entries are not acked (they go idle and are redelivered)."""
    unstored: list[JobResult] = []
    if results or also is not None:
        unstored = attempt(
            lambda: commit_results(
                session_factory=session_factory, results=results, worker_id=worker_id, also=also
            ),
            "result write",
        )
    lost = {r.job_id for r in unstored}
    acks = [e for e in entries if e[2] not in lost] + list(skipped)
    if acks:
        attempt(lambda: ack(redis_client=redis_client, keys=keys, entries=acks), "ack")
    # every stored job: one cancelled after it ended (or while its result was on the way)
    # would otherwise leave its id in the cancels set
    done = [r.job_id for r in results if r.job_id not in lost]
    if done:
        attempt(
            lambda: clear_cancels(redis_client=redis_client, keys=keys, job_ids=done),
            "clear cancels",
        )
    return unstored


def commit_results(
    *,
    session_factory: sessionmaker[Session],
    results: Sequence[JobResult],
    worker_id: str,
    also: Callable[[Session], None] | None = None,
) -> list[JobResult]:
    """Write the results in one transaction (with ``also``'s writes); when the store refuses
    it (not an outage: those are raised), write each result alone. Returns those for which
    even that was refused."""
    try:
        with session_factory.begin() as session:
            job_status.finish_jobs(session=session, results=results, worker_id=worker_id)
            if also is not None:
                also(session)
    except Exception as exc:
        if is_transient(exc):
            raise
        log.exception("batched write refused; writing results one by one")
        return _commit_one_by_one(session_factory, results, worker_id)
    return []


def _commit_one_by_one(
    session_factory: sessionmaker[Session], results: Sequence[JobResult], worker_id: str
) -> list[JobResult]:
    """Write each result alone; one the store refuses is stored as a failure instead.
    Returns those for which even that was refused."""
    unstored: list[JobResult] = []
    for result in results:
        try:
            with session_factory.begin() as session:
                job_status.finish_jobs(session=session, results=[result], worker_id=worker_id)
        except Exception as exc:
            if is_transient(exc):
                raise
            # The driver's text names tables and quotes values: it goes to this log, the
            # tenant reads only the generic message and its code.
            log.error("the store refused job %s's result (%s): %s", result.job_id,
                      UNSTORABLE_RESULT_CODE, exc)
            failure = JobResult(job_id=result.job_id, status="failed", error=UNSTORABLE_RESULT_ERROR)
            try:
                with session_factory.begin() as session:
                    job_status.finish_jobs(session=session, results=[failure], worker_id=worker_id)
            except Exception as exc2:
                if is_transient(exc2):
                    raise
                log.exception("could not store job %s, not even as failed", result.job_id)
                unstored.append(result)
    return unstored
