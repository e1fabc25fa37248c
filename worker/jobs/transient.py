"""Which failures of the two stores the lifecycle joins are outages (worth retrying), as
opposed to bad data (retrying would fail the same way)."""

from __future__ import annotations

import redis
from sqlalchemy.exc import DBAPIError, OperationalError

TRANSIENT = (
    OperationalError,
    redis.ConnectionError,
    redis.TimeoutError,
    ConnectionError,
    TimeoutError,
)


def is_transient(exc: BaseException) -> bool:
    """Connection-level failures (the server is away), as opposed to bad data."""
    if isinstance(exc, TRANSIENT):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)
