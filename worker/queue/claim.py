"""Take over entries left pending by a dead worker.

``take_over_stale`` moves ownership with XAUTOCLAIM ... JUSTID, which does not count as a
delivery; the new owner then redelivers them to itself (``consumer.redeliver``) as it has
room, one at a time for suspects. So an entry's delivery count grows only when a worker
really tries to run it, and the dead-letter limit means "tried this many times".
"""

from __future__ import annotations

from typing import Any

import redis

from worker.queue.group import ensure_groups, is_nogroup
from worker.queue.keys import QueueKeys


def take_over_stale(
    *, redis_client: redis.Redis, keys: QueueKeys, consumer: str, min_idle_ms: int, count: int
) -> list[tuple[str, str]]:
    """Make ``consumer`` the owner of up to ``count`` entries idle for ``min_idle_ms`` or
    more (interactive first); returns their ``(stream, entry_id)``."""
    out: list[tuple[str, str]] = []
    for stream in keys.streams:
        want = count - len(out)
        if want <= 0:
            break
        try:
            reply: Any = redis_client.xautoclaim(
                stream, keys.group, consumer, min_idle_ms, "0-0", count=want, justid=True
            )
        except redis.ResponseError as exc:
            if is_nogroup(exc):
                ensure_groups(redis_client=redis_client, keys=keys)
                continue
            raise
        out += [(stream, str(entry_id)) for entry_id in reply]
    return out
