"""Cancellation: recorded in SQL (a queued job ends at once; a running one keeps its
request in the jobs row), then signalled to the running job's worker through Redis.

The record is the cancel: a signal Redis cannot take (down, restarted) is logged and
dropped, and the worker's periodic read of recorded cancels stops the job anyway. A job
handed back after its cancel was recorded ends ``cancelled`` at its next start."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import redis
from sqlalchemy.orm import Session, sessionmaker

from worker.queue.cancel import flag_cancel
from worker.queue.keys import QueueKeys
from worker.store.crud import job_status

log = logging.getLogger(__name__)


def request_cancel(
    *,
    session_factory: sessionmaker[Session],
    redis_client: redis.Redis,
    keys: QueueKeys,
    job_id: str,
) -> str | None:
    """Cancel ``job_id``. Returns its status afterwards: ``cancelled`` (was queued),
    ``running`` (its worker will abort it between steps and write ``cancelled``), a terminal
    status (nothing to do), or None (no such job)."""
    with session_factory.begin() as session:
        status = job_status.cancel_job(session=session, job_id=job_id)
    if status == "running":
        _signal(redis_client, keys, [job_id])
    return status


def cancel_batch(
    *,
    session_factory: sessionmaker[Session],
    redis_client: redis.Redis,
    keys: QueueKeys,
    batch_id: str,
) -> int:
    """Cancel every open job of a batch (its cancel, or its expiry): the queued ones end at
    once and the running ones get their cancel recorded, in one statement, then their
    workers are signalled. Returns how many jobs it cancelled or signalled."""
    with session_factory.begin() as session:
        ended, running = job_status.cancel_batch_jobs(session=session, batch_id=batch_id)
    _signal(redis_client, keys, running)
    return ended + len(running)


def cancel_open_of_batch(*, session: Session, batch_id: str) -> list[str]:
    """:func:`cancel_batch`'s SQL in the caller's transaction (an expiry: with the
    batch's own move, so no job of it starts in between); returns the running jobs'
    ids, for :func:`signal_cancels` once the caller committed."""
    return job_status.cancel_batch_jobs(session=session, batch_id=batch_id)[1]


def signal_cancels(*, redis_client: redis.Redis, keys: QueueKeys, job_ids: Sequence[str]) -> None:
    """Flag recorded cancels for their workers (best effort: the record is the cancel)."""
    _signal(redis_client, keys, job_ids)


def cancel_queued_of_batch(*, session: Session, batch_id: str) -> int:
    """End the batch's queued jobs ``cancelled`` in the caller's transaction (a batch whose
    expansion failed: its running jobs finish). SQL only: no worker holds them."""
    return job_status.cancel_queued_batch_jobs(session=session, batch_id=batch_id)


def _signal(redis_client: redis.Redis, keys: QueueKeys, job_ids: Sequence[str]) -> None:
    """Flag each recorded cancel for its worker; best effort (the record is the cancel)."""
    for job_id in job_ids:
        try:
            flag_cancel(redis_client=redis_client, keys=keys, job_id=job_id)
        except redis.RedisError as exc:
            log.warning("cancel of %s recorded; its worker reads it without the signal: %s",
                        job_id, exc)
