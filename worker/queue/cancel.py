"""Cancel signals: the Redis set a running job's worker polls between engine steps (the
cancel itself is recorded in SQL first, :mod:`worker.jobs.cancel`).

Each marker expires on its own, ``CANCEL_TTL_S`` after it was set: a sorted set beside
the set (``<cancels>:at``, scored by when each id was flagged) tells which are old, and
every new flag first removes the old ones. A marker its worker never cleared (the worker
died, the job ended elsewhere) therefore goes away instead of staying forever; losing one
is harmless, since workers also read recorded cancels from SQL."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, cast

import redis

from worker.queue.keys import QueueKeys

CANCEL_TTL_S = 24 * 3600
"""How long a cancel marker lives (a job it was meant for ends long before)."""

PRUNE_BATCH = 1000
"""Old markers removed per new flag at most (more than one goes in per flag)."""

# KEYS: the set, the sorted set of flag times; ARGV: cutoff, batch, now, job id, ttl (both
# keys also expire whole once no flag came for a TTL, markers set before the sorted set too)
_FLAG = """
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
if #old > 0 then
  redis.call('SREM', KEYS[1], unpack(old))
  redis.call('ZREM', KEYS[2], unpack(old))
end
redis.call('SADD', KEYS[1], ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[5])
return #old
"""


def flagged_at_key(keys: QueueKeys) -> str:
    """The sorted set of when each cancel marker was set (its expiry's clock), in the hash
    slot of the set (both are changed by one script)."""
    return keys.cancels_at


def flag_cancel(
    *, redis_client: redis.Redis, keys: QueueKeys, job_id: str, now: float | None = None
) -> int:
    """Signal a running job's worker that its (already recorded) cancel is due, removing
    markers older than ``CANCEL_TTL_S`` in the same script; returns how many went."""
    now = time.time() if now is None else now
    script = cast(Any, redis_client).register_script(_FLAG)
    return int(
        script(
            keys=[keys.cancels, flagged_at_key(keys)],
            args=[now - CANCEL_TTL_S, PRUNE_BATCH, now, job_id, CANCEL_TTL_S],
        )
    )


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
        pipe = cast(Any, redis_client).pipeline(transaction=True)
        pipe.srem(keys.cancels, *job_ids)
        pipe.zrem(flagged_at_key(keys), *job_ids)
        pipe.execute()
