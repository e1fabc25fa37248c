"""Consumer names: stable across restarts (so a restarted worker replays its own pending
entries) and held by one live process at a time (a Redis lock with a TTL)."""

from __future__ import annotations

import logging
import socket
import threading
import uuid

import redis

from worker.queue.keys import QueueKeys

log = logging.getLogger(__name__)


def acquire_name(
    *,
    redis_client: redis.Redis,
    keys: QueueKeys,
    name: str | None,
    ttl_s: float,
    stop: threading.Event,
    max_suffix: int = 64,
) -> tuple[str, str]:
    """Take a consumer name and return ``(name, lock_token)``.

    An explicit ``name`` is waited for while another live process holds it (after a
    kill -9 the lock expires within ``ttl_s``). Without one, the first free of
    ``<host>``, ``<host>-1``, ... is taken.
    """
    token = uuid.uuid4().hex
    ttl_ms = int(ttl_s * 1000)
    if name:
        warned = False
        while not stop.is_set():
            if redis_client.set(keys.consumer_lock(name), token, nx=True, px=ttl_ms):
                return name, token
            if not warned:
                log.warning("consumer name %r is held by a live worker; waiting for it", name)
                warned = True
            stop.wait(0.5)
        raise InterruptedError("stopped while waiting for the consumer name")
    host = socket.gethostname()
    for i in range(max_suffix):
        candidate = host if i == 0 else f"{host}-{i}"
        if redis_client.set(keys.consumer_lock(candidate), token, nx=True, px=ttl_ms):
            return candidate, token
    raise RuntimeError(f"no free consumer name among {host}..{host}-{max_suffix - 1}")


# Atomic, so another process cannot take the name between our check and our write.
_RENEW = """
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if not held then return redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) and 1 or 0 end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def renew_name(
    *, redis_client: redis.Redis, keys: QueueKeys, name: str, token: str, ttl_s: float
) -> bool:
    """Extend our lock on ``name`` (or take it back if it expired); False when another
    process holds it now."""
    lock = keys.consumer_lock(name)
    return bool(redis_client.eval(_RENEW, 1, lock, token, int(ttl_s * 1000)))


def release_name(*, redis_client: redis.Redis, keys: QueueKeys, name: str, token: str) -> None:
    """Give the name back if we still hold it."""
    redis_client.eval(_RELEASE, 1, keys.consumer_lock(name), token)
