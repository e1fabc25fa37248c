"""Trim job streams without ever deleting an entry that is pending or not yet delivered,
and drop the batch lanes left with nothing to do (``worker.queue.lanes``)."""

from __future__ import annotations

from typing import Any, cast

import redis

from worker.queue.entry_ids import id_key
from worker.queue.keys import QueueKeys
from worker.queue.lanes import drop_drained_lanes, job_streams


def _next_id(entry_id: str) -> str:
    ms, _, seq = entry_id.partition("-")
    return f"{ms}-{int(seq or 0) + 1}"


def safe_min_id(*, redis_client: redis.Redis, stream: str) -> str | None:
    """The smallest id that must be kept: the oldest pending entry of any group, or the
    first entry no group has read yet. None if the stream has no group (keep everything)."""
    try:
        groups: list[dict[str, Any]] = cast(Any, redis_client).xinfo_groups(stream)
    except redis.ResponseError:
        return None
    if not groups:
        return None
    keep: list[str] = []
    for g in groups:
        keep.append(_next_id(str(g["last-delivered-id"])))
        if int(g["pending"]):
            summary: Any = cast(Any, redis_client).xpending(stream, g["name"])
            if summary and summary.get("min"):
                keep.append(str(summary["min"]))
    return min(keep, key=id_key)


def trim_streams(*, redis_client: redis.Redis, keys: QueueKeys) -> int:
    """XTRIM MINID each job stream to its safe minimum, then drop the lanes with nothing
    pending or undelivered (their entries go with them); returns how many entries went."""
    removed = 0
    streams = job_streams(redis_client=redis_client, keys=keys)
    for stream in streams:
        min_id = safe_min_id(redis_client=redis_client, stream=stream)
        if min_id is not None:
            removed += int(cast(Any, redis_client).xtrim(stream, minid=min_id, approximate=False))
    lanes = [s for s in streams if keys.lane_end(s) is not None]
    _, deleted = drop_drained_lanes(redis_client=redis_client, keys=keys, lanes=lanes)
    return removed + deleted
