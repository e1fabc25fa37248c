"""Publishing: XADD job messages to their class streams (Redis only; the rows were
committed first by :mod:`worker.jobs.enqueue` or are being re-published), each entry
recorded as its job's carrier in the same script (``worker.queue.carried``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import redis

from worker.queue.keys import QueueKeys
from worker.queue.message import JobMessage

# XADD the message and name the new entry as its job's carrier, atomically.
_PUBLISH = """
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2))
redis.call('HSET', KEYS[2], ARGV[1], KEYS[1] .. '|' .. id)
return id
"""


def publish(
    *, redis_client: redis.Redis, keys: QueueKeys, messages: Sequence[tuple[str, JobMessage]]
) -> list[str]:
    """XADD ``(queue_class, message)`` pairs in one pipeline; returns the entry ids."""
    if not messages:
        return []
    script = cast(Any, redis_client).register_script(_PUBLISH)
    pipe = redis_client.pipeline(transaction=False)
    for queue_class, msg in messages:
        flat = [x for kv in msg.encode().items() for x in kv]
        script(keys=[keys.stream(queue_class), keys.carried], args=[msg.job_id, *flat], client=pipe)
    return [x.decode() if isinstance(x, bytes) else str(x) for x in pipe.execute()]
