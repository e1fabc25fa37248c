"""Publishing: XADD job messages to their class streams (Redis only; the rows were
committed first by :mod:`worker.jobs.enqueue` or are being re-published)."""

from __future__ import annotations

from collections.abc import Sequence

import redis

from worker.queue.keys import QueueKeys
from worker.queue.message import JobMessage


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
