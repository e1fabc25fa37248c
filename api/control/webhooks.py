"""Webhook delivery: POST the job object to its callback URL once the job has ended,
retrying with exponential backoff (state in ``api_jobs``, so retries survive restarts).

Each delivery is claimed first (``FOR UPDATE SKIP LOCKED`` and a lease with a holder id,
renewed while the run lasts and checked on every write), so overlapping beats never send
the same one; the destination is checked again after DNS resolution
and the connection goes to the checked address; the body is signed with the tenant's
secret (see docs/api.md, "Webhook signatures"); one delivery has a total deadline; the
tenant sees only a status class of the outcome, never the receiver's answer."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from datetime import timedelta

import httpx

from api.context import Context
from api.control.destinations import Destination, DestinationRefused, resolve
from api.views import job_view
from worker.store.base import utcnow
from worker.store.crud.api_jobs import (
    claim_due_webhooks,
    get_api_job,
    record_webhook_attempt,
    webhook_lease,
)
from worker.store.crud.jobs import get_job
from worker.store.crud.leases import Lease
from worker.store.crud.tenant_usage import webhook_secret

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Inflight-Signature"
TIMESTAMP_HEADER = "X-Inflight-Timestamp"


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The signature header value: ``v1=`` + hex HMAC-SHA256 of ``"<timestamp>." + body``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "v1=" + mac.hexdigest()


LEASE_MARGIN_S = 30.0
"""A delivery's lease lasts its total deadline plus this (DNS, the SQL writes around it)."""


def deliver_due_webhooks(ctx: Context) -> dict[str, int]:
    """Claim every due webhook and try each once; returns counts of delivered / retrying /
    failed / lost (another claimer took it over after this one's lease ran out).

    Before each delivery the lease of every claimed delivery not yet tried is renewed, so a
    long run (up to 100 deliveries of up to ``webhook_total_timeout`` each) keeps what it
    claimed; one that failed to renew (a stall longer than the lease) is skipped, never sent
    twice. A delivery that fails in any way is recorded as a failed attempt of that row
    alone: nothing raises out of this loop, so one bad row cannot hold up the others."""
    lease = webhook_lease(
        timedelta(seconds=ctx.settings.webhook_total_timeout + LEASE_MARGIN_S)
    )
    with ctx.session_factory.begin() as session:
        job_ids = claim_due_webhooks(session=session, lease=lease)
    stats = {"delivered": 0, "retrying": 0, "failed": 0, "lost": 0}
    for i in range(len(job_ids)):
        stats[_deliver_guarded(ctx, lease, job_ids[i:])] += 1
    return stats


def _deliver_guarded(ctx: Context, lease: Lease, claimed: list[str]) -> str:
    """Renew the leases of ``claimed`` (the rest of this run), then deliver its first;
    any error is that delivery's failed attempt (or, when even that cannot be written,
    logged: the lease runs out and a later beat tries again)."""
    job_id = claimed[0]
    try:
        with ctx.session_factory.begin() as session:
            ours = lease.renew(session, claimed)
        if job_id not in ours:
            log.warning("webhook for %s: lease taken over by another claimer; skipped", job_id)
            return "lost"
        return deliver_one(ctx, lease=lease, job_id=job_id)
    except Exception:
        log.exception("webhook for %s: delivery failed", job_id)
    try:
        with ctx.session_factory() as session:
            meta = get_api_job(session=session, job_id=job_id)
            attempts = meta.webhook_attempts if meta is not None else 0
        give_up = attempts + 1 >= ctx.settings.webhook_max_attempts
        if not _record(ctx, lease, job_id, attempts, "delivery error", give_up=give_up):
            return "lost"
        return "failed" if give_up else "retrying"
    except Exception:
        log.exception("webhook for %s: the failed attempt could not be recorded", job_id)
        return "failed"


def deliver_one(ctx: Context, *, lease: Lease, job_id: str) -> str:
    """One delivery attempt for one job claimed under ``lease``: ``delivered``,
    ``retrying``, ``failed``, or ``lost`` (the lease ran out before it was sent or
    recorded; the claimer that took it over owns it)."""
    with ctx.session_factory.begin() as session:
        job = get_job(session=session, job_id=job_id)
        meta = get_api_job(session=session, job_id=job_id)
        if job is None or meta is None:
            return "failed"
        attempts = meta.webhook_attempts
        if not meta.callback_url:
            return _recorded(ctx, lease, job_id, attempts, "no callback_url", give_up=True)
        payload = {
            "type": f"job.{job.status}",
            "data": job_view(job, model_name=ctx.settings.model_name, meta=None),
        }
        url, tenant = meta.callback_url, meta.tenant
        secret = webhook_secret(session=session, tenant=tenant)
    body = json.dumps(payload, separators=(",", ":")).encode()
    timestamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        "X-Inflight-Event": str(payload["type"]),
        "X-Inflight-Job-Id": job_id,
        "X-Inflight-Delivery-Attempt": str(attempts + 1),
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: sign(secret, timestamp, body),
    }
    try:
        dest = resolve(url, allow_hosts=ctx.settings.webhook_allow_hosts)
    except DestinationRefused as exc:
        return _recorded(ctx, lease, job_id, attempts, f"refused: {exc}", give_up=True)
    with ctx.session_factory.begin() as session:  # DNS took its time: a full lease to send
        if job_id not in lease.renew(session, [job_id]):
            log.warning("webhook for %s: lease ran out during DNS; not sent", job_id)
            return "lost"
    error = _post(dest, body, headers, ctx.settings.webhook_timeout,
                  ctx.settings.webhook_total_timeout)
    if error is None:
        with ctx.session_factory.begin() as session:
            written = record_webhook_attempt(
                session=session, lease=lease, job_id=job_id, delivered=True
            )
        return "delivered" if written else "lost"
    give_up = attempts + 1 >= ctx.settings.webhook_max_attempts
    return _recorded(ctx, lease, job_id, attempts, error, give_up=give_up)


def _recorded(
    ctx: Context, lease: Lease, job_id: str, attempts: int, error: str, *, give_up: bool
) -> str:
    """Record a failed attempt; the outcome's name (``lost`` when the lease ran out)."""
    if not _record(ctx, lease, job_id, attempts, error, give_up=give_up):
        return "lost"
    return "failed" if give_up else "retrying"


def _record(
    ctx: Context, lease: Lease, job_id: str, attempts: int, error: str, *, give_up: bool
) -> bool:
    """Write one failed attempt (retry after the backoff, or give up) while ``lease``
    holds the row; False when it no longer does (nothing written)."""
    delay = ctx.settings.webhook_backoff * (2**attempts)
    with ctx.session_factory.begin() as session:
        written = record_webhook_attempt(
            session=session,
            lease=lease,
            job_id=job_id,
            delivered=False,
            error=error,
            next_at=None if give_up else utcnow() + timedelta(seconds=delay),
            give_up=give_up,
        )
    if not written:
        log.warning("webhook for %s: lease taken over; this attempt is not recorded", job_id)
        return False
    log.info(
        "webhook for %s not delivered (%s); %s",
        job_id,
        error,
        "giving up" if give_up else f"retrying in {delay:.1f}s",
    )
    return True


def _post(
    dest: Destination, body: bytes, headers: dict[str, str], timeout: float, total: float
) -> str | None:
    """POST ``body`` to the checked address of ``dest``; None when the receiver answered
    2xx, else a status class ("HTTP 5xx", "timeout", "connection failed"). The whole
    exchange is cut at ``total`` seconds, however slowly the receiver drips bytes."""
    host = f"[{dest.address}]" if ":" in dest.address else dest.address
    target = httpx.URL(dest.url).copy_with(host=host.strip("[]"))
    default_port = 443 if dest.scheme == "https" else 80
    host_header = dest.host if dest.port == default_port else f"{dest.host}:{dest.port}"
    client = httpx.Client(timeout=min(timeout, total), follow_redirects=False)
    watchdog = threading.Timer(total, client.close)
    watchdog.start()
    started = time.monotonic()
    try:
        with client.stream(
            "POST",
            target,
            content=body,
            headers={**headers, "Host": host_header},
            extensions={"sni_hostname": dest.host},
        ) as resp:
            status = resp.status_code  # the body is never read
        if 200 <= status < 300:
            return None
        return f"HTTP {status // 100}xx"
    except httpx.TimeoutException:
        return "timeout"
    except Exception:  # a closed client, refused connection, TLS failure...
        if time.monotonic() - started >= total:
            return "timeout"
        return "connection failed"
    finally:
        watchdog.cancel()
        client.close()
