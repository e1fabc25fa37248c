"""Cancellation: a queued job ends at once; a running one is flagged for its worker."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import redis
from sqlalchemy.orm import Session, sessionmaker

from worker.queue.keys import QueueKeys
from worker.store.crud.jobs import cancel_job

CANCEL_TTL_S = 7 * 24 * 3600


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
        pipe = redis_client.pipeline(transaction=False)
        pipe.sadd(keys.cancels, job_id)
        pipe.expire(keys.cancels, CANCEL_TTL_S)
        pipe.execute()
    return status


def cancelled_among(
    *, redis_client: redis.Redis, keys: QueueKeys, job_ids: Sequence[str]
) -> set[str]:
    """Which of these (in-flight) jobs have a pending cancellation."""
    if not job_ids:
        return set()
    flags = cast(Any, redis_client).smismember(keys.cancels, list(job_ids))
    return {j for j, f in zip(job_ids, flags, strict=True) if f}


def clear_cancels(*, redis_client: redis.Redis, keys: QueueKeys, job_ids: Sequence[str]) -> None:
    """Forget cancellation flags that were carried out."""
    if job_ids:
        cast(Any, redis_client).srem(keys.cancels, *job_ids)
