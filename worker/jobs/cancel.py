"""Cancellation: recorded in SQL (a queued job ends at once; a running one keeps its
request in the jobs row), then signalled to the running job's worker through Redis.

The record is the cancel: a signal Redis cannot take (down, restarted) is logged and
dropped, and the worker's periodic read of recorded cancels stops the job anyway."""

from __future__ import annotations

import logging

import redis
from sqlalchemy.orm import Session, sessionmaker

from worker.queue.cancel import flag_cancel
from worker.queue.keys import QueueKeys
from worker.store.crud.jobs import cancel_job

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
        status = cancel_job(session=session, job_id=job_id)
    if status == "running":
        try:
            flag_cancel(redis_client=redis_client, keys=keys, job_id=job_id)
        except redis.RedisError as exc:
            log.warning("cancel of %s recorded; its worker reads it without the signal: %s",
                        job_id, exc)
    return status
