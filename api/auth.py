"""Bearer API keys: ``Authorization: Bearer <key>`` resolves to a tenant."""

from __future__ import annotations

import threading
import time

from fastapi import Request

from api.errors import ApiError
from worker.store.crud.api_keys import hash_key, tenant_for_key


class KeyCache:
    """Key hash -> (tenant, expiry): status polls do not hit SQL for the key every time.
    A revoked key stops working within ``ttl`` seconds."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._items: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def get(self, digest: str) -> str | None:
        """The cached tenant, or None when absent or stale."""
        item = self._items.get(digest)
        if item is None or item[1] < time.monotonic():
            return None
        return item[0]

    def put(self, digest: str, tenant: str) -> None:
        """Remember a resolved key."""
        with self._lock:
            if len(self._items) > 10_000:
                self._items.clear()
            self._items[digest] = (tenant, time.monotonic() + self.ttl)


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, message, code="invalid_api_key", type="authentication_error")


def current_tenant(request: Request) -> str:
    """FastAPI dependency: the tenant of the request's API key (401 otherwise)."""
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if not header:
        raise _unauthorized(
            "Missing API key: send 'Authorization: Bearer <key>' (create one "
            "with `inflight keys create --tenant T`)"
        )
    if scheme.lower() != "bearer" or not key.strip():
        raise _unauthorized("Malformed Authorization header: expected 'Bearer <key>'")
    key = key.strip()
    ctx = request.app.state.ctx
    cache: KeyCache = request.app.state.key_cache
    digest = hash_key(key)
    tenant = cache.get(digest)
    if tenant is None:
        with ctx.session_factory() as session:
            tenant = tenant_for_key(session=session, key=key)
        if tenant is None:
            raise _unauthorized("Incorrect or revoked API key")
        cache.put(digest, tenant)
    request.state.tenant = tenant
    return tenant
