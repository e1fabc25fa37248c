"""Deleting every key of one deployment prefix (of every model, and the legacy names): what
the tests and benchmarks do with their throwaway prefixes. SCAN walks every node of a
cluster."""

from __future__ import annotations

from typing import Any, cast

import redis

from worker.queue.keys import QueueKeys


def delete_deployment(*, redis_client: redis.Redis, keys: QueueKeys) -> int:
    """Delete every key under ``keys.prefix``; returns how many went."""
    client = cast(Any, redis_client)
    n = 0
    for pattern in keys.patterns:
        for key in client.scan_iter(match=pattern, count=1000):
            n += int(client.delete(key))
    return n
