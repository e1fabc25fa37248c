"""What a tenant holds now (open jobs and batches, stored bytes), for the quotas, and
the tenant's webhook signing secret."""

from __future__ import annotations

import base64
import secrets

from sqlalchemy import func, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from worker.store.base import utcnow
from worker.store.job_lifecycle import OPEN
from worker.store.models import Batch, Job, StoredFile, WebhookSecret

OPEN_BATCH_STATUSES = ("validating", "in_progress", "cancelling", "finalizing")


def lock_tenant(*, session: Session, tenant: str) -> None:
    """Serialize this transaction with every other that takes the same tenant's lock, until
    it ends (PostgreSQL's transaction-scoped advisory lock), so a count and the insert it
    allows cannot interleave with another request's. SQLite serializes writers itself."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(
            text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"),
            {"key": f"inflight:tenant:{tenant}"},
        )


def open_jobs(*, session: Session, tenant: str) -> int:
    """Jobs of ``tenant`` queued or running."""
    stmt = select(func.count()).where(Job.tenant == tenant, Job.status.in_(OPEN))
    return int(session.scalar(stmt) or 0)


def open_batches(*, session: Session, tenant: str) -> int:
    """Batches of ``tenant`` that have not ended."""
    stmt = select(func.count()).where(
        Batch.tenant == tenant, Batch.status.in_(OPEN_BATCH_STATUSES)
    )
    return int(session.scalar(stmt) or 0)


def stored_bytes(*, session: Session, tenant: str) -> int:
    """Bytes of the files ``tenant`` has uploaded (and not deleted)."""
    stmt = select(func.coalesce(func.sum(StoredFile.bytes), 0)).where(StoredFile.tenant == tenant)
    return int(session.scalar(stmt) or 0)


def new_webhook_secret() -> str:
    """A fresh signing secret in the Standard Webhooks form: ``whsec_`` + the standard
    base64 of 32 random bytes (the bytes batch events' ``webhook-signature`` is keyed with,
    as OpenAI's SDK decodes them)."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def webhook_secret(*, session: Session, tenant: str) -> str:
    """The tenant's webhook signing secret, created (race-free) on first use."""
    found = session.get(WebhookSecret, tenant)
    if found is not None:
        return found.secret
    fresh = new_webhook_secret()
    if session.get_bind().dialect.name == "postgresql":
        session.execute(
            pg_insert(WebhookSecret)
            .values(tenant=tenant, secret=fresh, created_at=utcnow())
            .on_conflict_do_nothing(index_elements=["tenant"])
        )
    else:
        session.merge(WebhookSecret(tenant=tenant, secret=fresh, created_at=utcnow()))
    session.flush()
    session.expire_all()
    row = session.get(WebhookSecret, tenant)
    assert row is not None
    return row.secret


def rotate_webhook_secret(*, session: Session, tenant: str) -> str:
    """Replace the tenant's webhook secret with a new one; returns it. One upsert (INSERT
    ... ON CONFLICT DO UPDATE), so concurrent rotations never collide on a first insert:
    each succeeds, and the secret ends as the one committed last."""
    fresh = new_webhook_secret()
    now = utcnow()
    insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    session.execute(
        insert(WebhookSecret)
        .values(tenant=tenant, secret=fresh, created_at=now)
        .on_conflict_do_update(index_elements=["tenant"], set_={"secret": fresh, "created_at": now})
    )
    session.expire_all()  # a WebhookSecret this session loaded is stale now
    return fresh
