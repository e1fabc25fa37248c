"""How the consumer group sees some streams: length, pending, undelivered and consumers of
each, read for all of them in one pipeline (XLEN and XINFO GROUPS per stream)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis


@dataclass
class GroupFigures:
    """One stream as ``group`` sees it. ``pending`` (delivered, not acked), ``lag`` (not
    delivered yet) and ``consumers`` are None where the group does not exist (no stream,
    or the dead-letter stream, which has none). Where Redis cannot tell the lag (entries
    deleted in the middle of the stream) it is estimated as length less pending,
    ``lag_estimated``."""

    length: int = 0
    pending: int | None = None
    lag: int | None = None
    consumers: int | None = None
    lag_estimated: bool = False

    @property
    def unfinished(self) -> int:
        """Entries not acked: undelivered plus pending (all of them where no group reads)."""
        if self.pending is None or self.lag is None:
            return self.length
        return self.lag + self.pending


def group_figures(
    redis_client: redis.Redis, streams: Sequence[str], group: str
) -> list[GroupFigures]:
    """The figures of each of ``streams`` (in their order); a missing stream reads as
    empty. One round trip (one hash slot on a cluster when the streams share a tag)."""
    if not streams:
        return []
    pipe = cast(Any, redis_client).pipeline(transaction=False)
    for stream in streams:
        pipe.xlen(stream)
        pipe.xinfo_groups(stream)
    replies = pipe.execute(raise_on_error=False)
    out: list[GroupFigures] = []
    for i in range(len(streams)):
        length, groups = replies[2 * i], replies[2 * i + 1]
        figures = GroupFigures(length=int(length) if isinstance(length, int) else 0)
        mine = [] if isinstance(groups, Exception) else [
            g for g in groups if str(g.get("name")) == group
        ]
        if mine:
            g = mine[0]
            figures.pending = int(g.get("pending") or 0)
            figures.consumers = int(g.get("consumers") or 0)
            lag = g.get("lag")
            if lag is None:
                figures.lag = max(0, figures.length - figures.pending)
                figures.lag_estimated = True
            else:
                figures.lag = int(lag)
        out.append(figures)
    return out
