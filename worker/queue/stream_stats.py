"""Per-stream figures for ``inflight top``: length, pending and undelivered entries and
consumers of the group, for each job stream and the dead-letter stream of one model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import redis

from worker.queue.keys import QUEUE_CLASSES, QueueKeys


@dataclass
class StreamStats:
    """One stream as the consumer group sees it. ``pending`` (delivered, not acked),
    ``lag`` (not delivered yet) and ``consumers`` are None where the group does not exist
    (the dead-letter stream has none). Where Redis cannot tell the lag (entries deleted
    in the middle of the stream) it is estimated as length less pending, ``lag_estimated``."""

    stream: str
    length: int
    model: str | None = None
    kind: str = ""  # the queue class, or "dead"
    pending: int | None = None
    lag: int | None = None
    consumers: int | None = None
    lag_estimated: bool = False


def stream_stats(*, redis_client: redis.Redis, keys: QueueKeys) -> list[StreamStats]:
    """XLEN and the consumer group's XINFO GROUPS entry of each job stream of ``keys.model``
    (interactive first), then the dead-letter stream's length. A missing stream reads as
    empty."""
    client = cast(Any, redis_client)
    out = []
    kinds = [*QUEUE_CLASSES, "dead"]
    for stream, kind in zip([*keys.streams, keys.dead], kinds, strict=True):
        stats = StreamStats(stream=stream, length=int(client.xlen(stream)), model=keys.model,
                            kind=kind)
        try:
            groups: list[dict[str, Any]] = client.xinfo_groups(stream)
        except redis.ResponseError:  # no such stream
            groups = []
        group = next((g for g in groups if str(g.get("name")) == keys.group), None)
        if group is not None:
            stats.pending = int(group.get("pending") or 0)
            stats.consumers = int(group.get("consumers") or 0)
            lag = group.get("lag")
            if lag is None:
                stats.lag, stats.lag_estimated = max(0, stats.length - stats.pending), True
            else:
                stats.lag = int(lag)
        out.append(stats)
    return out
