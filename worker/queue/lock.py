"""A renewable Redis lock: taken with SET NX EX, extended and released only by its holder."""

from __future__ import annotations

from typing import Any, cast

import redis

# Extend or delete the lock only while it is still ours.
_RENEW = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then "
    "return redis.call('EXPIRE', KEYS[1], ARGV[2]) end return 0"
)
_RELEASE = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)


class RenewableLock:
    """A Redis lock with a TTL, renewed at each stage of a long run so that it is held for
    as long as the run lasts (two reconcilers never publish the same missing job twice)."""

    def __init__(self, client: redis.Redis, key: str, token: str, ttl_s: int) -> None:
        self.client, self.key, self.token, self.ttl_s = cast(Any, client), key, token, ttl_s

    def take(self) -> bool:
        """Take the lock; False when another reconciler holds it."""
        return bool(self.client.set(self.key, self.token, nx=True, ex=self.ttl_s))

    def renew(self) -> None:
        """Extend the lock; raises when it expired and was taken by another."""
        if not self.client.eval(_RENEW, 1, self.key, self.token, self.ttl_s):
            raise RuntimeError(f"the lock {self.key} was lost; another holder runs")

    def release(self) -> None:
        """Delete the lock if it is still ours."""
        self.client.eval(_RELEASE, 1, self.key, self.token)
