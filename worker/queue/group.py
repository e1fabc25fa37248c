"""Consumer-group set-up; recreated on demand after Redis lost its data."""

from __future__ import annotations

import redis

from worker.queue.keys import QueueKeys


def ensure_groups(*, redis_client: redis.Redis, keys: QueueKeys) -> None:
    """Create every job stream and the consumer group on it if missing (idempotent)."""
    for stream in keys.streams:
        try:
            redis_client.xgroup_create(stream, keys.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise


def is_nogroup(exc: BaseException) -> bool:
    """True when Redis says the stream or group does not exist (e.g. after a flush)."""
    return isinstance(exc, redis.ResponseError) and "NOGROUP" in str(exc)
