"""Per-tenant quotas: queued jobs, jobs per minute, open batches, stored bytes. Over a
quota the request is answered 429 with ``Retry-After``; a quota of 0 is off.

The queued-jobs, open-batches and stored-bytes quotas are exact: each count runs inside the
transaction that writes what it limits, under a per-tenant lock (PostgreSQL's advisory
lock; SQLite serializes writers), so concurrent requests of one tenant cannot pass it
together. The per-minute rate is a Redis counter per tenant and minute, exact."""

from __future__ import annotations

import time
from collections.abc import Callable

import redis
from sqlalchemy.orm import Session

from api.admission import refusal
from api.context import Context
from api.errors import ApiError
from worker.queue.admission import redis_refusal
from worker.store.crud.tenant_usage import lock_tenant, open_batches, open_jobs, stored_bytes


def _over(what: str, limit: int, retry_after: int, param: str | None = None) -> ApiError:
    return ApiError(
        429,
        f"quota exceeded: {what} (the limit is {limit}); retry after {retry_after}s",
        code="quota_exceeded",
        param=param,
        headers={"Retry-After": str(retry_after)},
    )


def _locked_quota(
    session: Session, tenant: str, *, limit: int, used: Callable[..., int], adding: int,
    what: str, retry_after: int, param: str | None = None,
) -> None:
    """Take the tenant's lock (held to the end of the transaction that writes what the
    quota limits), then refuse (429) if ``used + adding`` would pass ``limit`` (0: off).
    ``what`` says what is used, with ``{n}`` for the count."""
    if not limit:
        return
    lock_tenant(session=session, tenant=tenant)
    n = used(session=session, tenant=tenant)
    if n + adding > limit:
        raise _over(what.format(n=n, adding=adding), limit, retry_after, param=param)


def check_queued_jobs(ctx: Context, session: Session, tenant: str, adding: int = 1) -> None:
    """Inside the transaction that inserts ``adding`` jobs of ``tenant``: its open jobs."""
    _locked_quota(session, tenant, limit=ctx.settings.quota_queued_jobs, used=open_jobs,
                  adding=adding, what="{n} jobs queued or running", retry_after=30)


def check_job_quotas(ctx: Context, tenant: str) -> None:
    """Before a job submission: the tenant's submissions this minute (the open-jobs quota
    is checked where the job is inserted, :func:`check_queued_jobs`)."""
    s = ctx.settings
    if s.quota_jobs_per_minute:
        now = time.time()
        minute = int(now // 60)
        key = ctx.keys.rate(tenant, minute)
        pipe = ctx.redis.pipeline(transaction=True)
        pipe.incr(key)
        pipe.expire(key, 120)
        try:
            count = int(pipe.execute()[0])
        except redis.RedisError as exc:  # the counter is a write: same answer as admission
            raise refusal(redis_refusal(exc)) from exc
        if count > s.quota_jobs_per_minute:
            retry = max(1, 60 - int(now % 60))
            raise _over("jobs submitted this minute", s.quota_jobs_per_minute, retry)


def check_batch_quota(ctx: Context, session: Session, tenant: str) -> None:
    """Inside the transaction that creates a batch: the tenant's batches not yet ended."""
    _locked_quota(session, tenant, limit=ctx.settings.quota_open_batches, used=open_batches,
                  adding=1, what="{n} batches open", retry_after=60)


def precheck_storage_quota(ctx: Context, tenant: str, adding: int) -> None:
    """Before an upload is copied to storage: 429 when ``adding`` more bytes would pass
    the tenant's stored-bytes quota as it is now (no lock: the exact check is
    :func:`check_storage_quota`, where the file is recorded), so a tenant over its quota
    has nothing written to storage."""
    limit = ctx.settings.quota_stored_bytes
    if not limit:
        return
    with ctx.session_factory() as session:
        n = stored_bytes(session=session, tenant=tenant)
        session.rollback()
    if n + adding > limit:
        raise _over(f"{n} bytes stored, {adding} more asked", limit, 3600, param="file")


def check_storage_quota(ctx: Context, session: Session, tenant: str, adding: int) -> None:
    """Inside the transaction that records a file of ``adding`` bytes: the tenant's stored
    bytes."""
    _locked_quota(session, tenant, limit=ctx.settings.quota_stored_bytes, used=stored_bytes,
                  adding=adding, what="{n} bytes stored, {adding} more asked",
                  retry_after=3600, param="file")
