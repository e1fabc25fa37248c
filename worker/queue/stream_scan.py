"""Which job ids the job streams still carry (pending or not yet read)."""

from __future__ import annotations

from typing import Any, cast

import redis

from worker.queue.keys import QueueKeys


def job_ids_in_streams(*, redis_client: redis.Redis, keys: QueueKeys, page: int = 2000) -> set[str]:
    """Job ids carried by any entry still in a job stream (pending or not yet read)."""
    present: set[str] = set()
    for stream in keys.streams:
        start = "-"
        while True:
            entries = cast(Any, redis_client).xrange(stream, min=start, max="+", count=page)
            for _entry_id, fields in entries:
                if fields and "job_id" in fields:
                    present.add(fields["job_id"])
            if len(entries) < page:
                break
            start = "(" + entries[-1][0]
    return present
