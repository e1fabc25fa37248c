"""Webhook delivery: POST the job object to its callback URL once the job has ended,
retrying with exponential backoff (state in ``api_jobs``, so retries survive restarts)."""

from __future__ import annotations

import logging
from datetime import timedelta

import httpx

from api.context import Context
from api.views import job_view
from worker.store.base import utcnow
from worker.store.crud.api_jobs import due_webhooks, get_api_job, record_webhook_attempt
from worker.store.crud.jobs import get_job

log = logging.getLogger(__name__)


def deliver_due_webhooks(ctx: Context, *, client: httpx.Client | None = None) -> dict[str, int]:
    """Try every due webhook once; returns counts of delivered / retrying / failed."""
    with ctx.session_factory() as session:
        job_ids = due_webhooks(session=session)
    stats = {"delivered": 0, "retrying": 0, "failed": 0}
    if not job_ids:
        return stats
    own = client is None
    http = client or httpx.Client(timeout=ctx.settings.webhook_timeout)
    try:
        for job_id in job_ids:
            stats[deliver_one(ctx, job_id=job_id, client=http)] += 1
    finally:
        if own:
            http.close()
    return stats


def deliver_one(ctx: Context, *, job_id: str, client: httpx.Client) -> str:
    """One delivery attempt for one job: ``delivered``, ``retrying`` or ``failed``."""
    with ctx.session_factory() as session:
        job = get_job(session=session, job_id=job_id)
        meta = get_api_job(session=session, job_id=job_id)
        if job is None or meta is None or not meta.callback_url:
            return "failed"
        payload = {
            "type": f"job.{job.status}",
            "data": job_view(job, model_name=ctx.settings.model_name),
        }
        url, attempts = meta.callback_url, meta.webhook_attempts
    error: str | None = None
    try:
        resp = client.post(
            url,
            json=payload,
            headers={
                "X-Inflight-Event": str(payload["type"]),
                "X-Inflight-Job-Id": job_id,
                "X-Inflight-Delivery-Attempt": str(attempts + 1),
            },
        )
        if 200 <= resp.status_code < 300:
            with ctx.session_factory.begin() as session:
                record_webhook_attempt(session=session, job_id=job_id, delivered=True)
            return "delivered"
        error = f"HTTP {resp.status_code}"
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    give_up = attempts + 1 >= ctx.settings.webhook_max_attempts
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
        "webhook for %s failed (%s); %s",
        job_id,
        error,
        "giving up" if give_up else f"retrying in {delay:.1f}s",
    )
    return "failed" if give_up else "retrying"
