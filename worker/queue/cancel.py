"""Cancel signals: the Redis set a running job's worker polls between engine steps (the
cancel itself is recorded in SQL first, :mod:`worker.jobs.cancel`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import redis

from worker.queue.keys import QueueKeys

CANCEL_TTL_S = 7 * 24 * 3600


def flag_cancel(*, redis_client: redis.Redis, keys: QueueKeys, job_id: str) -> None:
    """Signal a running job's worker that its (already recorded) cancel is due."""
    pipe = redis_client.pipeline(transaction=False)
    pipe.sadd(keys.cancels, job_id)
    pipe.expire(keys.cancels, CANCEL_TTL_S)
    pipe.execute()


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
