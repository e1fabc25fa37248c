"""Webhook delivery: POST the job object to a job's callback URL once the job has ended,
and a batch's event (``batch.completed``, ``.failed``, ``.expired``, ``.cancelled``, in
OpenAI's shape) to a batch's once it has ended, retrying with exponential backoff (state
in ``api_jobs`` and ``batches``, so retries survive restarts). Both kinds go through one
delivery (:class:`Outbox` says where each kind's rows are and what it sends).

Each delivery is claimed first (``FOR UPDATE SKIP LOCKED`` and a lease with a holder id,
renewed while the run lasts and checked on every write), so overlapping beats never send
the same one; the destination is checked again after DNS resolution
and the connection goes to the checked address; the body is signed with the tenant's
secret (see docs/api.md, "Webhook signatures"); one delivery has a total deadline; the
tenant sees only a status class of the outcome, never the receiver's answer. A batch event
is also signed as Standard Webhooks (OpenAI's webhooks) are: ``webhook-id``,
``webhook-timestamp``, ``webhook-signature``, so OpenAI's SDK verifies it
(``client.webhooks.unwrap(body, headers, secret=<the tenant's secret>)``)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx

from api.context import Context
from api.control.destinations import Destination, DestinationRefused, resolve
from api.views import epoch, job_view
from worker.store.base import utcnow
from worker.store.crud.api_jobs import (
    WEBHOOK_STATE,
    claim_due_webhooks,
    get_api_job,
    webhook_lease,
)
from worker.store.crud.batch_events import (
    BATCH_EVENT_STATE,
    batch_event_lease,
    claim_due_batch_events,
)
from worker.store.crud.batches import get_batch
from worker.store.crud.deliveries import DeliveryColumns, record_attempt
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


def standard_key(secret: str) -> bytes:
    """The key of a Standard Webhooks signature, as OpenAI's SDK takes it from the secret:
    the base64 after ``whsec_``. A secret from before that form (``whsec_`` + URL-safe
    text, which does not decode) keys with its own bytes; rotating it gives one the SDK
    verifies."""
    if secret.startswith("whsec_"):
        with contextlib.suppress(binascii.Error, ValueError):
            return base64.b64decode(secret[6:], validate=True)
    return secret.encode()


def sign_standard(secret: str, event_id: str, timestamp: int, body: bytes) -> str:
    """The Standard Webhooks signature (what OpenAI's SDK checks): ``v1,`` + base64
    HMAC-SHA256, keyed with :func:`standard_key`, of ``"<id>.<timestamp>." + body``."""
    mac = hmac.new(standard_key(secret), f"{event_id}.{timestamp}.".encode() + body,
                   hashlib.sha256)
    return "v1," + base64.b64encode(mac.digest()).decode()


LEASE_MARGIN_S = 30.0
"""A delivery's lease lasts its total deadline plus this (DNS, the SQL writes around it)."""


@dataclass(frozen=True)
class Delivery:
    """One delivery ready to send: where, for which tenant (whose secret signs it), the
    payload, the headers of its kind, and for an event its id (Standard Webhooks)."""

    url: str
    tenant: str
    payload: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    event_id: str | None = None


@dataclass(frozen=True)
class Outbox:
    """One kind of delivery: how its rows are leased, claimed and recorded, how many
    attempts a row has made, and what it sends (a :class:`Delivery`, or why there is
    nothing to send: given up at once)."""

    kind: str  # "job" or "batch", for the logs
    lease: Callable[[timedelta], Lease]
    claim: Callable[..., list[str]]
    columns: DeliveryColumns  # where an attempt is recorded
    attempts: Callable[[Any, str], int | None]
    build: Callable[[Context, Any, str, int], Delivery | str]


def _job_attempts(session: Any, job_id: str) -> int | None:
    meta = get_api_job(session=session, job_id=job_id)
    return None if meta is None else meta.webhook_attempts


def _job_delivery(ctx: Context, session: Any, job_id: str, attempts: int) -> Delivery | str:
    """``{"type": "job.<status>", "data": <job object>}`` to the job's callback URL."""
    job = get_job(session=session, job_id=job_id)
    meta = get_api_job(session=session, job_id=job_id)
    if job is None or meta is None:
        return "no such job"
    if not meta.callback_url:
        return "no callback_url"
    payload = {"type": f"job.{job.status}",
               "data": job_view(job, model_name=ctx.settings.model_name, meta=None)}
    return Delivery(url=meta.callback_url, tenant=meta.tenant, payload=payload, headers={
        "X-Inflight-Event": str(payload["type"]), "X-Inflight-Job-Id": job_id})


def _batch_attempts(session: Any, batch_id: str) -> int | None:
    batch = get_batch(session=session, batch_id=batch_id)
    return None if batch is None else batch.webhook_attempts


def event_id(batch_id: str) -> str:
    """The id of a batch's one event (its final status is reached once), the same on every
    attempt, so a receiver drops a repeat by ``webhook-id``."""
    return "evt_" + batch_id.removeprefix("batch_")


def _batch_delivery(ctx: Context, session: Any, batch_id: str, attempts: int) -> Delivery | str:
    """OpenAI's batch event: ``{"id": "evt_...", "object": "event", "type":
    "batch.<status>", "created_at": <when it reached it>, "data": {"id": <batch id>}}``."""
    batch = get_batch(session=session, batch_id=batch_id)
    if batch is None:
        return "no such batch"
    if not batch.callback_url:
        return "no callback_url"
    ended_at = getattr(batch, f"{batch.status}_at", None)
    payload = {"id": event_id(batch_id), "object": "event", "type": f"batch.{batch.status}",
               "created_at": epoch(ended_at) or int(time.time()), "data": {"id": batch_id}}
    return Delivery(url=batch.callback_url, tenant=batch.tenant, payload=payload,
                    event_id=str(payload["id"]), headers={
                        "X-Inflight-Event": str(payload["type"]),
                        "X-Inflight-Batch-Id": batch_id})


JOBS = Outbox("job", webhook_lease, claim_due_webhooks, WEBHOOK_STATE, _job_attempts,
              _job_delivery)
BATCHES = Outbox("batch", batch_event_lease, claim_due_batch_events, BATCH_EVENT_STATE,
                 _batch_attempts, _batch_delivery)


def deliver_due_webhooks(ctx: Context) -> dict[str, int]:
    """Claim every due delivery, job webhooks then batch events, and try each once;
    returns counts of delivered / retrying / failed / lost (another claimer took it over
    after this one's lease ran out).

    Before each delivery the lease of every claimed delivery not yet tried is renewed, so a
    long run (up to 100 deliveries of each kind of up to ``webhook_total_timeout`` each)
    keeps what it claimed; one that failed to renew (a stall longer than the lease) is
    skipped, never sent twice. A delivery that fails in any way is recorded as a failed
    attempt of that row alone: nothing raises out of this loop, so one bad row cannot hold
    up the others."""
    stats = {"delivered": 0, "retrying": 0, "failed": 0, "lost": 0}
    for box in (JOBS, BATCHES):
        lease = box.lease(
            timedelta(seconds=ctx.settings.webhook_total_timeout + LEASE_MARGIN_S))
        with ctx.session_factory.begin() as session:
            keys = box.claim(session=session, lease=lease)
        for i in range(len(keys)):
            stats[_deliver_guarded(ctx, box, lease, keys[i:])] += 1
    return stats


def _deliver_guarded(ctx: Context, box: Outbox, lease: Lease, claimed: list[str]) -> str:
    """Renew the leases of ``claimed`` (the rest of this run), then deliver its first;
    any error is that delivery's failed attempt (or, when even that cannot be written,
    logged: the lease runs out and a later beat tries again)."""
    key = claimed[0]
    try:
        with ctx.session_factory.begin() as session:
            ours = lease.renew(session, claimed)
        if key not in ours:
            log.warning("webhook for %s %s: lease taken over by another claimer; skipped",
                        box.kind, key)
            return "lost"
        return deliver_one(ctx, box=box, lease=lease, key=key)
    except Exception:
        log.exception("webhook for %s %s: delivery failed", box.kind, key)
    try:
        with ctx.session_factory() as session:
            attempts = box.attempts(session, key) or 0
        give_up = attempts + 1 >= ctx.settings.webhook_max_attempts
        if not _record(ctx, box, lease, key, attempts, "delivery error", give_up=give_up):
            return "lost"
        return "failed" if give_up else "retrying"
    except Exception:
        log.exception("webhook for %s %s: the failed attempt could not be recorded",
                      box.kind, key)
        return "failed"


def deliver_one(ctx: Context, *, box: Outbox, lease: Lease, key: str) -> str:
    """One delivery attempt for one row of ``box`` claimed under ``lease``: ``delivered``,
    ``retrying``, ``failed``, or ``lost`` (the lease ran out before it was sent or
    recorded; the claimer that took it over owns it)."""
    with ctx.session_factory.begin() as session:
        attempts = box.attempts(session, key)
        if attempts is None:
            return "failed"
        built = box.build(ctx, session, key, attempts)
        if isinstance(built, str):
            return _recorded(ctx, box, lease, key, attempts, built, give_up=True)
        secret = webhook_secret(session=session, tenant=built.tenant)
    body = json.dumps(built.payload, separators=(",", ":")).encode()
    timestamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        **built.headers,
        "X-Inflight-Delivery-Attempt": str(attempts + 1),
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: sign(secret, timestamp, body),
    }
    if built.event_id is not None:
        headers |= {"webhook-id": built.event_id, "webhook-timestamp": str(timestamp),
                    "webhook-signature": sign_standard(secret, built.event_id, timestamp, body)}
    try:
        dest = resolve(built.url, allow_hosts=ctx.settings.webhook_allow_hosts)
    except DestinationRefused as exc:
        return _recorded(ctx, box, lease, key, attempts, f"refused: {exc}", give_up=True)
    with ctx.session_factory.begin() as session:  # DNS took its time: a full lease to send
        if key not in lease.renew(session, [key]):
            log.warning("webhook for %s %s: lease ran out during DNS; not sent", box.kind, key)
            return "lost"
    error = _post(dest, body, headers, ctx.settings.webhook_timeout,
                  ctx.settings.webhook_total_timeout)
    if error is None:
        with ctx.session_factory.begin() as session:
            written = record_attempt(session=session, lease=lease, columns=box.columns,
                                     key=key, delivered=True)
        return "delivered" if written else "lost"
    give_up = attempts + 1 >= ctx.settings.webhook_max_attempts
    return _recorded(ctx, box, lease, key, attempts, error, give_up=give_up)


def _recorded(
    ctx: Context, box: Outbox, lease: Lease, key: str, attempts: int, error: str, *,
    give_up: bool,
) -> str:
    """Record a failed attempt; the outcome's name (``lost`` when the lease ran out)."""
    if not _record(ctx, box, lease, key, attempts, error, give_up=give_up):
        return "lost"
    return "failed" if give_up else "retrying"


def _record(
    ctx: Context, box: Outbox, lease: Lease, key: str, attempts: int, error: str, *,
    give_up: bool,
) -> bool:
    """Write one failed attempt (retry after the backoff, or give up) while ``lease``
    holds the row; False when it no longer does (nothing written)."""
    delay = ctx.settings.webhook_backoff * (2**attempts)
    with ctx.session_factory.begin() as session:
        written = record_attempt(
            session=session,
            lease=lease,
            columns=box.columns,
            key=key,
            delivered=False,
            error=error,
            next_at=None if give_up else utcnow() + timedelta(seconds=delay),
            give_up=give_up,
        )
    if not written:
        log.warning("webhook for %s %s: lease taken over; this attempt is not recorded",
                    box.kind, key)
        return False
    log.info(
        "webhook for %s %s not delivered (%s); %s",
        box.kind,
        key,
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
