"""Redis client construction from ``REDIS_URL`` or a flag."""

from __future__ import annotations

import os

import redis

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def redis_url(flag: str | None = None) -> str:
    """The URL to use: the flag if given, else ``REDIS_URL``, else redis://127.0.0.1:6379/0."""
    return flag or os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL


def make_redis(*, url: str) -> redis.Redis:
    """A client returning ``str`` values, with timeouts so a dead server is noticed."""
    return redis.Redis.from_url(
        url,
        decode_responses=True,
        socket_connect_timeout=5,
        socket_timeout=30,
        health_check_interval=30,
    )
