"""Consumer-group set-up; recreated on demand after Redis lost its data."""

from __future__ import annotations

import redis

from worker.queue.keys import QueueKeys


def ensure_groups(*, redis_client: redis.Redis, keys: QueueKeys) -> None:
    """Create the interactive stream and the consumer group on it if missing (idempotent).
    A batch lane gets its stream and group from the publish that makes it
    (``worker.queue.producer``), never here: a lane made here would not be in the lane set."""
    try:
        redis_client.xgroup_create(keys.interactive, keys.group, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def is_nogroup(exc: BaseException) -> bool:
    """True when Redis says the stream or group does not exist (e.g. after a flush), or
    that a blocked read's stream was deleted under it (a lane dropped by the trim)."""
    return isinstance(exc, redis.ResponseError) and (
        "NOGROUP" in str(exc) or "UNBLOCKED" in str(exc)
    )
