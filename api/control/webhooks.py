"""Webhook delivery: POST the job object to its callback URL once the job has ended,
retrying with exponential backoff (state in ``api_jobs``, so retries survive restarts).

Each delivery is claimed first (``FOR UPDATE SKIP LOCKED`` and a lease), so overlapping
beats never send the same one; the destination is checked again after DNS resolution
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
from worker.store.crud.api_jobs import claim_due_webhooks, get_api_job, record_webhook_attempt
from worker.store.crud.jobs import get_job
from worker.store.crud.tenant_usage import webhook_secret

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Inflight-Signature"
TIMESTAMP_HEADER = "X-Inflight-Timestamp"


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The signature header value: ``v1=`` + hex HMAC-SHA256 of ``"<timestamp>." + body``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "v1=" + mac.hexdigest()


def deliver_due_webhooks(ctx: Context) -> dict[str, int]:
    """Claim every due webhook and try each once; returns counts of delivered /
    retrying / failed."""
    lease = timedelta(seconds=ctx.settings.webhook_total_timeout + 30.0)
    with ctx.session_factory.begin() as session:
        job_ids = claim_due_webhooks(session=session, lease_until=utcnow() + lease)
    stats = {"delivered": 0, "retrying": 0, "failed": 0}
    for job_id in job_ids:
        stats[deliver_one(ctx, job_id=job_id)] += 1
    return stats


def deliver_one(ctx: Context, *, job_id: str) -> str:
    """One delivery attempt for one (claimed) job: ``delivered``, ``retrying`` or
    ``failed``."""
    with ctx.session_factory.begin() as session:
        job = get_job(session=session, job_id=job_id)
        meta = get_api_job(session=session, job_id=job_id)
        if job is None or meta is None or not meta.callback_url:
            return "failed"
        payload = {
            "type": f"job.{job.status}",
            "data": job_view(job, model_name=ctx.settings.model_name, meta=None),
        }
        url, attempts, tenant = meta.callback_url, meta.webhook_attempts, meta.tenant
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
        _record(ctx, job_id, attempts, f"refused: {exc}", give_up=True)
        return "failed"
    error = _post(dest, body, headers, ctx.settings.webhook_timeout,
                  ctx.settings.webhook_total_timeout)
    if error is None:
        with ctx.session_factory.begin() as session:
            record_webhook_attempt(session=session, job_id=job_id, delivered=True)
        return "delivered"
    give_up = attempts + 1 >= ctx.settings.webhook_max_attempts
    _record(ctx, job_id, attempts, error, give_up=give_up)
    return "failed" if give_up else "retrying"


def _record(ctx: Context, job_id: str, attempts: int, error: str, *, give_up: bool) -> None:
    delay = ctx.settings.webhook_backoff * (2**attempts)
    with ctx.session_factory.begin() as session:
        record_webhook_attempt(
            session=session,
            job_id=job_id,
            delivered=False,
            error=error,
            next_at=None if give_up else utcnow() + timedelta(seconds=delay),
            give_up=give_up,
        )
    log.info(
        "webhook for %s not delivered (%s); %s",
        job_id,
        error,
        "giving up" if give_up else f"retrying in {delay:.1f}s",
    )


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
