"""Take over entries left pending by a dead worker.

``take_over_stale`` moves ownership with XAUTOCLAIM ... JUSTID, which does not count as a
delivery; the new owner then redelivers them to itself (``consumer.redeliver``) as it has
room, one at a time for suspects. So an entry's delivery count grows only when a worker
really tries to run it, and the dead-letter limit means "tried this many times".

XAUTOCLAIM looks at no more than ten times COUNT pending entries per call, so the scan
resumes where the previous call stopped (``cursors``, held by the caller, one per stream)
and starts again from "0-0" once Redis says it went round: entries of a dead worker that
lie behind many entries live workers keep fresh are reached after a few calls.
"""

from __future__ import annotations

from typing import Any, cast

import redis

from worker.queue.group import ensure_groups, is_nogroup
from worker.queue.keys import QueueKeys
from worker.queue.lanes import job_streams

START = "0-0"

# XAUTOCLAIM ... JUSTID inside a script, whose reply reaches the caller as Redis gave it:
# redis-py's parser of the command drops the cursor when JUSTID is given. ARGV: group,
# consumer, min idle ms, cursor, count.
_XAUTOCLAIM = (
    "return redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], "
    "'COUNT', ARGV[5], 'JUSTID')"
)


def take_over_stale(
    *,
    redis_client: redis.Redis,
    keys: QueueKeys,
    consumer: str,
    min_idle_ms: int,
    count: int,
    cursors: dict[str, str] | None = None,
) -> list[tuple[str, str]]:
    """Make ``consumer`` the owner of up to ``count`` entries idle for ``min_idle_ms`` or
    more (interactive first, then each lane, earliest deadline first); returns their
    ``(stream, entry_id)``. ``cursors`` (stream ->
    where the next scan starts) is read and updated in place; pass the same dict on every
    call. Without it each call scans from the start of each stream's pending list."""
    if cursors is None:
        cursors = {}
    out: list[tuple[str, str]] = []
    streams = job_streams(redis_client=redis_client, keys=keys)
    for gone in set(cursors) - set(streams):  # lanes dropped since
        del cursors[gone]
    for stream in streams:
        want = count - len(out)
        if want <= 0:
            break
        try:
            cursor, ids = autoclaim_ids(
                redis_client, stream, keys.group, consumer,
                min_idle_ms=min_idle_ms, cursor=cursors.get(stream, START), count=want,
            )
        except redis.ResponseError as exc:
            if is_nogroup(exc):
                if stream == keys.interactive:
                    ensure_groups(redis_client=redis_client, keys=keys)
                cursors.pop(stream, None)
                continue
            raise
        cursors[stream] = cursor
        out += [(stream, entry_id) for entry_id in ids]
    return out


def autoclaim_ids(
    redis_client: redis.Redis, stream: str, group: str, consumer: str, *,
    min_idle_ms: int, cursor: str, count: int,
) -> tuple[str, list[str]]:
    """One XAUTOCLAIM ... JUSTID: ``(where the next scan starts, the ids taken over)``."""
    script = cast(Any, redis_client).register_script(_XAUTOCLAIM)
    reply: Any = script(keys=[stream], args=[group, consumer, min_idle_ms, cursor, count])
    return _text(reply[0]), [_text(entry_id) for entry_id in reply[1]]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
