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

from typing import Any

import redis

from worker.queue.group import ensure_groups, is_nogroup
from worker.queue.keys import QueueKeys

START = "0-0"


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
    more (interactive first); returns their ``(stream, entry_id)``. ``cursors`` (stream ->
    where the next scan starts) is read and updated in place; pass the same dict on every
    call. Without it each call scans from the start of each stream's pending list."""
    if cursors is None:
        cursors = {}
    raw = _raw_xautoclaim_client(redis_client)
    out: list[tuple[str, str]] = []
    for stream in keys.streams:
        want = count - len(out)
        if want <= 0:
            break
        try:
            reply: Any = raw.execute_command(
                "XAUTOCLAIM",
                stream,
                keys.group,
                consumer,
                min_idle_ms,
                cursors.get(stream, START),
                "COUNT",
                want,
                "JUSTID",
            )
        except redis.ResponseError as exc:
            if is_nogroup(exc):
                ensure_groups(redis_client=redis_client, keys=keys)
                cursors.pop(stream, None)
                continue
            raise
        cursors[stream] = _text(reply[0])
        out += [(stream, _text(entry_id)) for entry_id in reply[1]]
    return out


def _raw_xautoclaim_client(redis_client: redis.Redis) -> redis.Redis:
    """A client on the same connection pool whose XAUTOCLAIM returns Redis's reply as is:
    redis-py's own parser drops the cursor when JUSTID is given, even for execute_command."""
    view = redis.Redis(connection_pool=redis_client.connection_pool)
    view.set_response_callback("XAUTOCLAIM", _as_is)
    return view


def _as_is(response: Any, **_options: Any) -> Any:
    return response


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
