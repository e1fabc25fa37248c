"""The one submission path of a single job, shared by ``POST /v1/jobs`` and the
OpenAI-compatible ``POST /v1/chat/completions`` / ``/v1/completions``: parse and validate
the OpenAI body (:func:`check_submission`), then answer a repeated idempotency key, refuse
what the queue or the tenant's quotas cannot take, and enqueue (SQL row first, then the
stream entry) (:func:`submit_job`)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import IntegrityError

from api.admission import admit_or_refuse
from api.context import Context
from api.control.destinations import DestinationRefused, resolve
from api.errors import ApiError
from api.limits import check_request_limits
from api.quotas import check_job_quotas, check_queued_jobs
from worker.jobs.enqueue import NotPublished, enqueuing
from worker.protocol.limits import check_id
from worker.protocol.openai_batch import GenerationRequest, parse_request_body
from worker.queue.job_events import FIELD as EVENTS_FIELD
from worker.store.crud.api_jobs import add_api_job, find_by_idempotency_key
from worker.store.crud.jobs import get_job, new_job_id
from worker.store.schemas import NewJob


@dataclass
class Submission:
    """One job to submit: the OpenAI ``body`` for ``endpoint`` and the job's own fields.
    ``events`` (``worker.queue.job_events``: ``"end"`` or ``"deltas"``) asks the worker to
    announce the job's end, and its text deltas, to a waiting API process."""

    endpoint: str
    body: dict[str, Any]
    queue_class: str = "interactive"
    priority: int = 0
    custom_id: str | None = None
    callback_url: str | None = None
    idempotency_key: str | None = None
    events: str | None = None

    def stored_request(self) -> dict[str, Any]:
        """The request as the job row and its stream message keep it."""
        stored: dict[str, Any] = {"url": self.endpoint, "body": self.body}
        if self.events:
            stored[EVENTS_FIELD] = self.events
        return stored

    def digest(self) -> str:
        """What an idempotency key is bound to."""
        fields: list[Any] = [
            self.endpoint,
            self.body,
            self.priority,
            self.custom_id,
            self.callback_url,
            self.queue_class,
        ]
        if self.events:
            fields.append(self.events)
        return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class Submitted:
    """The job's id; ``replayed`` when an earlier request with the same idempotency key
    created it."""

    job_id: str
    replayed: bool = False


def check_submission(ctx: Context, sub: Submission) -> GenerationRequest:
    """Validate everything before anything is written (400s): the body
    (``parse_request_body``: unknown and unsupported fields, sampling values), the input
    limits, the structured-output constraint, ids and the callback URL."""
    req = parse_request_body(sub.body, endpoint=sub.endpoint)
    check_request_limits(
        req,
        max_prompt_tokens=ctx.settings.max_prompt_tokens,
        max_tokens_limit=ctx.settings.max_tokens_limit,
        max_model_len=ctx.settings.max_model_len,
    )
    ctx.check_structured(req.params.structured)
    if sub.custom_id is not None:
        check_id(sub.custom_id, param="custom_id")
    if sub.callback_url is not None:
        try:
            resolve(sub.callback_url, allow_hosts=ctx.settings.webhook_allow_hosts)
        except DestinationRefused as exc:
            raise ApiError(
                400, str(exc), code="invalid_callback_url", param="callback_url"
            ) from None
    return req


def _replayed(ctx: Context, tenant: str, key: str, digest: str) -> str | None:
    """The job an earlier request with ``key`` created (409 if its body differed)."""
    with ctx.session_factory() as session:
        meta = find_by_idempotency_key(session=session, tenant=tenant, key=key)
        job = get_job(session=session, job_id=meta.job_id) if meta else None
    if meta is None or job is None:
        return None
    if meta.body_hash != digest:
        raise ApiError(
            409,
            f"idempotency key {key!r} was already used with a different request",
            code="idempotency_key_reused",
            param="idempotency_key",
        )
    return job.id


def submit_job(ctx: Context, tenant: str, sub: Submission) -> Submitted:
    """Enqueue a checked submission (:func:`check_submission` first): a repeated
    idempotency key answers the earlier job; 429/503 when the queue cannot take it, 429
    over the tenant's quotas; else the row is committed, then published (a publish that
    fails after the commit is left to the reconciler)."""
    key = sub.idempotency_key
    digest = sub.digest()
    if key:
        earlier = _replayed(ctx, tenant, key, digest)
        if earlier is not None:
            return Submitted(earlier, replayed=True)
    admit_or_refuse(ctx, sub.queue_class)  # 429/503 before anything is written or counted
    check_job_quotas(ctx, tenant)  # 429 over the tenant's quotas
    job = NewJob(
        request=sub.stored_request(),
        tenant=tenant,
        queue_class=sub.queue_class,
        priority=sub.priority,
        custom_id=sub.custom_id,
        id=new_job_id(),
    )
    try:
        with enqueuing(
            session_factory=ctx.session_factory, redis_client=ctx.redis, keys=ctx.keys, jobs=[job]
        ) as write:
            check_queued_jobs(ctx, write.session, tenant)  # 429, exact under the tenant's lock
            write.insert()
            add_api_job(
                session=write.session,
                job_id=job.id,
                tenant=tenant,
                idempotency_key=key,
                body_hash=digest,
                callback_url=sub.callback_url,
            )
    except NotPublished:
        pass  # committed: the job is durable and the reconciler publishes it
    except IntegrityError:
        earlier = _replayed(ctx, tenant, key, digest) if key else None
        if earlier is None:
            raise
        return Submitted(earlier, replayed=True)
    return Submitted(job.id)
