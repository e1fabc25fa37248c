"""The one submission path: every request becomes a job here, whoever sends it.

:func:`new_job` parses one request (an OpenAI body from ``POST /v1/jobs`` and the
OpenAI-compatible routes, or one JSONL line of a batch's input file or of
``inflight enqueue``), checks it (fields and sampling values, caller-chosen ids, the
callback URL, the token limits, the structured-output constraint) and makes its
:class:`NewJob`; nothing is written. :func:`submit_job` takes one job the API's way on
top of that: answer a repeated idempotency key, refuse what the queue or the tenant's
quotas cannot take, then enqueue (SQL row first, then the stream entry). Batch expansion
and ``inflight enqueue`` enqueue their lines' jobs by the chunk instead (a batch's quotas
are counted when it is created; ``inflight enqueue`` stops at the queue bound)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy.exc import IntegrityError

from api.admission import admit_or_refuse
from api.context import Context
from api.control.destinations import DestinationRefused, resolve
from api.control.models import resolve_model
from api.errors import ApiError, idempotency_key_reused
from api.limits import check_request_limits
from api.quotas import check_job_quotas, check_queued_jobs
from api.schemas import JobCreate
from worker.jobs.enqueue import NotPublished, enqueuing
from worker.protocol.limits import check_id
from worker.protocol.openai_batch import (
    CHAT_ENDPOINT,
    COMPLETIONS_ENDPOINT,
    GenerationRequest,
    RequestParseError,
    parse_request_body,
    parse_request_line,
)
from worker.queue.job_events import FIELD as EVENTS_FIELD
from worker.store.base import utcnow
from worker.store.crud.api_jobs import add_api_job, find_by_idempotency_key
from worker.store.crud.jobs import get_job, keyed_job_id, new_job_id
from worker.store.models import ApiJob, Job
from worker.store.schemas import NewJob


@dataclass
class Submission:
    """One request to make a job of, and the job's own fields.

    ``request`` is an OpenAI body for ``endpoint``, or one JSONL input line (bytes, number
    ``line_no``: an OpenAI Batch line or a plain prompt/messages line, whose url must be
    ``endpoint`` when that is set). A job of a batch (``batch_id``) has a custom_id unique
    in it, ``line-<n>`` when its line names none; its id is ``job_id`` when the caller
    derives one, else keyed by (batch, custom_id). ``events`` (``worker.queue.job_events``:
    ``"end"`` or ``"deltas"``) asks the worker to announce the job's end, and its text
    deltas, to a waiting API process. ``model``: the model of the batch (or ``inflight
    enqueue --model`` run) the line belongs to: a line naming none runs on it, one naming
    another is refused (``api.control.models``); None: each request's own model rules.
    ``deadline``: when batch work is due, the caller's (``POST /v1/jobs``, checked here) or
    its batch's (created_at + completion_window); None for batch work: 24 h after it is
    queued (``worker.jobs.enqueue``)."""

    tenant: str
    request: dict[str, Any] | bytes
    endpoint: str | None = None
    line_no: int = 0
    queue_class: str = "interactive"
    priority: int = 0
    custom_id: str | None = None
    batch_id: str | None = None
    job_id: str = ""
    callback_url: str | None = None
    key_header: str | None = None  # the Idempotency-Key header
    key_field: str | None = None  # the idempotency_key body field (the header wins)
    events: str | None = None
    model: str | None = None
    deadline: datetime | None = None

    @classmethod
    def of_job(cls, payload: JobCreate, *, tenant: str, key_header: str | None) -> Submission:
        """A ``POST /v1/jobs`` submission: the OpenAI body is every field that is not a
        job field; the endpoint is chat when it has ``messages``, unless it names one."""
        body = dict(payload.model_extra or {})
        return cls(
            tenant=tenant,
            request=body,
            endpoint=payload.endpoint
            or (CHAT_ENDPOINT if "messages" in body else COMPLETIONS_ENDPOINT),
            queue_class=payload.queue_class,
            priority=payload.priority,
            custom_id=payload.custom_id,
            callback_url=payload.callback_url,
            key_header=key_header,
            key_field=payload.idempotency_key,
            deadline=payload.deadline,
        )

    @property
    def idempotency_key(self) -> str | None:
        """The key a repeated submission is recognised by."""
        return self.key_header or self.key_field


@dataclass
class Checked:
    """A request that passed every check, and the job made of it."""

    request: GenerationRequest
    job: NewJob


class LineError(Exception):
    """Why one input line is not a job, as its error record says it: ``message`` (naming
    the line), ``code``, ``param`` and the line's ``custom_id`` when known."""

    def __init__(self, message: str, *, code: str, param: str | None, custom_id: str | None):
        super().__init__(message)
        self.message, self.code, self.param, self.custom_id = message, code, param, custom_id


def new_job(ctx: Context, sub: Submission, seen: set[str | None] | None = None) -> Checked:
    """Parse and check one request and make its job (nothing is written), on the model the
    rules of ``api.control.models`` give it. A body that fails raises what the API answers
    (RequestParseError, LimitError: 400; ApiError: 400, 404 for a model no worker serves,
    or 503 when every grammar helper stays busy); a line raises its :class:`LineError`.
    ``seen``: the custom_ids of the batch so far (the new one joins them)."""
    line = isinstance(sub.request, bytes)
    try:
        req = _parse(sub)
        custom_id = _custom_id(sub, req, seen)
    except RequestParseError as exc:
        if not line:
            raise
        raise LineError(str(exc), code=exc.code, param=exc.param, custom_id=exc.custom_id) from None
    try:
        model = resolve_model(ctx, req.model, batch_model=sub.model)
        _check(ctx, sub, req)
        deadline = sub.deadline if line else checked_deadline(sub.deadline, sub.queue_class)
    except ApiError as exc:
        if not line:
            raise
        raise LineError(f"line {sub.line_no}: {exc.message}", code=exc.code or "invalid_request",
                        param=exc.param, custom_id=custom_id) from None
    if seen is not None:
        seen.add(custom_id)
    stored: dict[str, Any] = {"url": req.endpoint, "body": req.body}
    if sub.events:
        stored[EVENTS_FIELD] = sub.events
    job_id = sub.job_id or (keyed_job_id(sub.batch_id, custom_id or "") if sub.batch_id
                            else new_job_id())
    job = NewJob(id=job_id, request=stored, tenant=sub.tenant, queue_class=sub.queue_class,
                 model=model, priority=sub.priority, custom_id=custom_id, batch_id=sub.batch_id,
                 max_tokens=allowed_output_tokens(req), deadline=deadline)
    return Checked(req, job)


def allowed_output_tokens(req: GenerationRequest) -> int | None:
    """The output tokens a request allows, all its ``n`` samples together (None when it
    names no ``max_tokens``: it runs to the model's context)."""
    mt = req.params.max_tokens
    return None if mt is None else mt * req.params.n


MAX_DEADLINE_AHEAD = timedelta(hours=9999)  # the longest completion_window a batch takes


def checked_deadline(deadline: datetime | None, queue_class: str) -> datetime | None:
    """A ``POST /v1/jobs`` deadline as stored (UTC), or the 400 that refuses it: one without
    a time zone, on interactive work (read before all batch work: a deadline would change
    nothing), not in the future, or further than the longest completion window."""
    if deadline is None:
        return None
    if deadline.tzinfo is None:
        raise ApiError(400, "deadline needs a time zone (e.g. 2027-01-01T12:00:00Z) or Unix "
                       "seconds", code="invalid_deadline", param="deadline")
    if queue_class != "batch":
        raise ApiError(400, "deadline is for batch work (queue_class \"batch\"); interactive "
                       "jobs are read before all batch work", code="invalid_deadline",
                       param="deadline")
    now = utcnow()
    if deadline <= now:
        raise ApiError(400, f"deadline {deadline.isoformat()} is not in the future",
                       code="invalid_deadline", param="deadline")
    if deadline > now + MAX_DEADLINE_AHEAD:
        raise ApiError(400, f"deadline {deadline.isoformat()} is more than 9999 hours away "
                       "(the longest completion_window)", code="invalid_deadline",
                       param="deadline")
    return deadline.astimezone(timezone.utc)


def _parse(sub: Submission) -> GenerationRequest:
    """The request parsed: unknown and unsupported fields, sampling values (400s)."""
    if not isinstance(sub.request, bytes):
        return parse_request_body(sub.request, endpoint=sub.endpoint or "")
    req = parse_request_line(sub.request, line_number=sub.line_no)
    if sub.endpoint is not None and req.endpoint != sub.endpoint:
        raise RequestParseError(
            f"url {req.endpoint!r} differs from the batch's endpoint {sub.endpoint!r}",
            param="url",
            line_number=sub.line_no,
            custom_id=req.custom_id,
        )
    return req


def _custom_id(sub: Submission, req: GenerationRequest, seen: set[str | None] | None) -> str | None:
    """The job's custom_id: the line's (checked by the parser) or the caller's; in a
    batch ``line-<n>`` when there is none, and never one of ``seen``."""
    custom_id = req.custom_id if isinstance(sub.request, bytes) else sub.custom_id
    if custom_id is not None:
        check_id(custom_id, param="custom_id")
    if sub.batch_id is None:
        return custom_id
    custom_id = custom_id or f"line-{sub.line_no}"
    if seen is not None and custom_id in seen:
        raise RequestParseError(
            f"duplicate custom_id {custom_id!r}; custom_id must be unique within a batch",
            param="custom_id",
            code="duplicate_custom_id",
            line_number=sub.line_no,
            custom_id=custom_id,
        )
    return custom_id


def check_callback_url(ctx: Context, url: str | None) -> None:
    """400 ``invalid_callback_url`` unless every address ``url``'s host resolves to may be
    POSTed to (public, or a host the operator allows; ``api/control/destinations.py``)."""
    if url is not None:
        try:
            resolve(url, allow_hosts=ctx.settings.webhook_allow_hosts)
        except DestinationRefused as exc:
            raise ApiError(400, str(exc), code="invalid_callback_url",
                           param="callback_url") from None


def _check(ctx: Context, sub: Submission, req: GenerationRequest) -> None:
    """The checks past parsing: the idempotency keys and the callback URL (400), the
    token limits (400), the structured-output constraint (400, or 503 when the grammar
    helpers stay busy; a line waits for one instead)."""
    for param, key in (("Idempotency-Key", sub.key_header), ("idempotency_key", sub.key_field)):
        if key is not None:
            check_id(key, param=param)
    check_callback_url(ctx, sub.callback_url)
    check_request_limits(
        req,
        max_prompt_tokens=ctx.settings.max_prompt_tokens,
        max_tokens_limit=ctx.settings.max_tokens_limit,
        max_model_len=ctx.settings.max_model_len,
    )
    ctx.check_structured(req.params.structured, patient=isinstance(sub.request, bytes))


@dataclass
class Submitted:
    """The job as stored (the rows written now, or an earlier request's when ``replayed``:
    its idempotency key had created it) and the request it runs."""

    request: GenerationRequest
    job: Job
    meta: ApiJob | None
    replayed: bool = False


def _digest(sub: Submission, job: NewJob) -> str:
    """What an idempotency key is bound to: the request and the job's own fields."""
    fields: list[Any] = [
        job.request["url"],
        job.request["body"],
        job.priority,
        job.custom_id,
        sub.callback_url,
        job.queue_class,
    ]
    if sub.events:
        fields.append(sub.events)
    if job.deadline is not None and job.batch_id is None:
        fields.append(job.deadline.timestamp())
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def _replayed(ctx: Context, tenant: str, key: str, digest: str) -> tuple[Job, ApiJob] | None:
    """The job an earlier request with ``key`` created, and its API row (409 if its body
    differed)."""
    with ctx.session_factory() as session:
        meta = find_by_idempotency_key(session=session, tenant=tenant, key=key)
        job = get_job(session=session, job_id=meta.job_id) if meta else None
    if meta is None or job is None:
        return None
    if meta.body_hash != digest:
        raise idempotency_key_reused(key, param="idempotency_key")
    return job, meta


def submit_job(ctx: Context, sub: Submission) -> Submitted:
    """Check and enqueue one job (:func:`new_job`): a repeated idempotency key answers the
    earlier job; 429/503 when the queue cannot take it, 429 over the tenant's quotas; else
    the rows are committed, then the job published (a publish that fails after the commit
    is left to the reconciler). The answer holds the rows as written, not read back."""
    checked = new_job(ctx, sub)
    job, key = checked.job, sub.idempotency_key
    digest = _digest(sub, job)
    earlier = _replayed(ctx, job.tenant, key, digest) if key else None
    if earlier is not None:
        return Submitted(checked.request, *earlier, replayed=True)
    admit_or_refuse(ctx, job.queue_class, model=str(job.model))  # 429/503 before any write
    check_job_quotas(ctx, job.tenant)  # 429 over the tenant's quotas
    try:
        with enqueuing(
            session_factory=ctx.session_factory, redis_client=ctx.redis, keys=ctx.keys, jobs=[job]
        ) as write:
            check_queued_jobs(ctx, write.session, job.tenant)  # 429, exact under the lock
            [row] = write.insert_rows()
            meta = add_api_job(
                session=write.session,
                job_id=job.id,
                tenant=job.tenant,
                idempotency_key=key,
                body_hash=digest,
                callback_url=sub.callback_url,
            )
    except NotPublished:
        pass  # committed: the job is durable and the reconciler publishes it
    except IntegrityError:
        earlier = _replayed(ctx, job.tenant, key, digest) if key else None
        if earlier is None:
            raise
        return Submitted(checked.request, *earlier, replayed=True)
    return Submitted(checked.request, row, meta)
