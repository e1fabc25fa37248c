"""Data access for ``api_keys``: create (returns the plain key once), resolve, list, revoke."""

from __future__ import annotations

import hashlib
import secrets
import uuid

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from worker.protocol.limits import check_tenant
from worker.store.base import utcnow
from worker.store.models import ApiKey

KEY_PREFIX = "ifk_"


def hash_key(key: str) -> str:
    """SHA-256 hex digest of a key (keys are 256-bit random, so no salt/KDF is needed)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def create_api_key(
    *, session: Session, tenant: str, name: str | None = None, read_only: bool = False
) -> tuple[ApiKey, str]:
    """Add a key for ``tenant`` (a valid tenant name, else LimitError); returns the row
    and the plain key (shown only now). A ``read_only`` key may only read."""
    check_tenant(tenant)
    plain = KEY_PREFIX + secrets.token_urlsafe(32)
    row = ApiKey(
        id="key_" + uuid.uuid4().hex,
        tenant=tenant,
        key_hash=hash_key(plain),
        prefix=plain[:10],
        name=name,
        created_at=utcnow(),
        read_only=read_only,
    )
    session.add(row)
    return row, plain


def tenant_for_key(*, session: Session, key: str) -> tuple[str, bool] | None:
    """(tenant, read_only) of a valid, unrevoked key, or None."""
    stmt = select(ApiKey.tenant, ApiKey.read_only).where(
        ApiKey.key_hash == hash_key(key), ApiKey.revoked_at.is_(None)
    )
    row = session.execute(stmt).first()
    return (row[0], bool(row[1])) if row is not None else None


def list_api_keys(*, session: Session, tenant: str | None = None) -> list[ApiKey]:
    """Keys (optionally of one tenant), oldest first."""
    stmt = select(ApiKey).order_by(ApiKey.created_at)
    if tenant is not None:
        stmt = stmt.where(ApiKey.tenant == tenant)
    return list(session.scalars(stmt))


def revoke_api_key(*, session: Session, key_id: str) -> bool:
    """Revoke a key by id; False if there is no such unrevoked key."""
    res = session.execute(
        update(ApiKey)
        .where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None))
        .values(revoked_at=utcnow())
    )
    return bool(res.rowcount)  # type: ignore[attr-defined]
