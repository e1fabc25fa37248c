"""Bearer API keys: ``Authorization: Bearer <key>`` resolves to a tenant."""

from __future__ import annotations

import hmac
import threading
import time

from fastapi import Request

from api.errors import ApiError
from worker.store.crud.api_keys import hash_key, tenant_for_key

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class KeyCache:
    """Key hash -> ((tenant, read_only), expiry): status polls do not hit SQL for the key
    every time. A revoked key stops working within ``ttl`` seconds."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._items: dict[str, tuple[tuple[str, bool], float]] = {}
        self._lock = threading.Lock()

    def get(self, digest: str) -> tuple[str, bool] | None:
        """The cached (tenant, read_only), or None when absent or stale."""
        item = self._items.get(digest)
        if item is None or item[1] < time.monotonic():
            return None
        return item[0]

    def put(self, digest: str, principal: tuple[str, bool]) -> None:
        """Remember a resolved key."""
        with self._lock:
            if len(self._items) > 10_000:
                self._items.clear()
            self._items[digest] = (principal, time.monotonic() + self.ttl)


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, message, code="invalid_api_key", type="authentication_error")


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if not header:
        raise _unauthorized(
            "Missing API key: send 'Authorization: Bearer <key>' (create one "
            "with `inflight keys create --tenant T`)"
        )
    if scheme.lower() != "bearer" or not key.strip() or len(key) > 256:
        raise _unauthorized("Malformed Authorization header: expected 'Bearer <key>'")
    return key.strip()


def current_tenant(request: Request) -> str:
    """FastAPI dependency: the tenant of the request's API key (401 otherwise; 403 for a
    read-only key on anything but a read). Sets ``request.state.tenant`` and
    ``request.state.read_only``."""
    key = _bearer(request)
    ctx = request.app.state.ctx
    cache: KeyCache = request.app.state.key_cache
    digest = hash_key(key)
    principal = cache.get(digest)
    if principal is None:
        with ctx.session_factory() as session:
            principal = tenant_for_key(session=session, key=key)
        if principal is None:
            raise _unauthorized("Incorrect or revoked API key")
        cache.put(digest, principal)
    tenant, read_only = principal
    if read_only and request.method not in READ_METHODS:
        raise _read_only_refused(f"{request.method} here")
    request.state.tenant = tenant
    request.state.read_only = read_only
    return tenant


def writing_tenant(request: Request) -> str:
    """FastAPI dependency for a read that hands out what only a writer may hold (the
    webhook signing secret, with which deliveries can be forged): the tenant of a key that
    can write; 403 for a read-only key whatever the method."""
    tenant = current_tenant(request)
    if request.state.read_only:
        raise _read_only_refused(f"{request.method} {request.url.path}")
    return tenant


def _read_only_refused(what: str) -> ApiError:
    return ApiError(
        403,
        f"this API key is read-only; use a key created without --read-only to {what}",
        code="permission_denied",
        type="permission_error",
    )


def require_operator(request: Request) -> None:
    """FastAPI dependency for operator endpoints: the bearer must be the configured
    ``operator_key`` (403 when none is configured, 401 when it does not match)."""
    expected = request.app.state.settings.operator_key
    if not expected:
        raise ApiError(
            403,
            "this endpoint is for operators and no operator key is configured "
            "(set INFLIGHT_OPERATOR_KEY)",
            code="permission_denied",
            type="permission_error",
        )
    key = _bearer(request)
    if not hmac.compare_digest(key.encode(), expected.encode()):
        raise _unauthorized("Incorrect operator key")
