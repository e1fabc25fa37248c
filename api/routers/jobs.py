"""Jobs: submit (idempotent), get, list, cancel."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from fastapi import APIRouter, Header, Query
from fastapi.responses import JSONResponse
from sqlalchemy.exc import IntegrityError

from api.admission import admit_or_refuse
from api.context import Context
from api.control.destinations import DestinationRefused, resolve
from api.deps import CtxDep, TenantDep
from api.errors import ApiError, known_id, not_found
from api.limits import check_request_limits
from api.openapi_links import links_to
from api.ownership import owned_batch
from api.quotas import check_job_quotas, check_queued_jobs
from api.schemas import JobCreate, JobObject, openai_body
from api.views import job_view
from worker.jobs.cancel import request_cancel
from worker.jobs.enqueue import NotPublished, enqueuing
from worker.protocol.limits import check_id
from worker.protocol.openai_batch import CHAT_ENDPOINT, COMPLETIONS_ENDPOINT, parse_request_body
from worker.store.crud.api_jobs import (
    add_api_job,
    find_by_idempotency_key,
    get_api_job,
    get_job_with_meta,
)
from worker.store.crud.jobs import get_job, list_jobs, new_job_id
from worker.store.models import Job
from worker.store.schemas import NewJob

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

JobStatusName = Literal["queued", "running", "succeeded", "failed", "cancelled"]


def _owned_job(ctx: Context, tenant: str, job_id: str, *, param: str = "id") -> Job:
    """The tenant's job ``job_id``; 404 naming ``param`` when it is absent or another
    tenant's (the two are not told apart)."""
    known_id("job", job_id, param=param)
    with ctx.session_factory() as session:
        job = get_job(session=session, job_id=job_id)
    if job is None or job.tenant != tenant:
        raise not_found("job", job_id, param=param)
    return job


def _view(ctx: Context, job: Job) -> dict[str, Any]:
    with ctx.session_factory() as session:
        meta = get_api_job(session=session, job_id=job.id)
    return job_view(job, model_name=ctx.settings.model_name, meta=meta)


def _replay(ctx: Context, tenant: str, key: str, body_hash: str) -> JSONResponse | None:
    with ctx.session_factory() as session:
        meta = find_by_idempotency_key(session=session, tenant=tenant, key=key)
        job = get_job(session=session, job_id=meta.job_id) if meta else None
    if meta is None or job is None:
        return None
    if meta.body_hash != body_hash:
        raise ApiError(
            409,
            f"idempotency key {key!r} was already used with a different request",
            code="idempotency_key_reused",
            param="idempotency_key",
        )
    return JSONResponse(
        job_view(job, model_name=ctx.settings.model_name, meta=meta),
        status_code=200,
        headers={"Idempotent-Replayed": "true"},
    )


@router.post(
    "",
    status_code=201,
    operation_id="createJob",
    responses={
        200: {"description": "idempotent replay"},
        201: {"description": "the job, queued", "model": JobObject,
              "links": links_to("job_id", "getJob", "cancelJob")},
    },
)
def create_job(
    *,
    payload: JobCreate,
    idempotency_key: str | None = Header(None, alias="Idempotency-Key", max_length=255),
    ctx: CtxDep,
    tenant: TenantDep,
) -> JSONResponse:
    """Submit one chat-completions or completions request as a job."""
    body = openai_body(payload)
    endpoint = payload.endpoint or (CHAT_ENDPOINT if "messages" in body else COMPLETIONS_ENDPOINT)
    req = parse_request_body(body, endpoint=endpoint)
    check_request_limits(
        req,
        max_prompt_tokens=ctx.settings.max_prompt_tokens,
        max_tokens_limit=ctx.settings.max_tokens_limit,
        max_model_len=ctx.settings.max_model_len,
    )
    ctx.check_structured(req.params.structured)
    if payload.custom_id is not None:
        check_id(payload.custom_id, param="custom_id")
    if idempotency_key is not None:
        check_id(idempotency_key, param="Idempotency-Key")
    if payload.idempotency_key is not None:
        check_id(payload.idempotency_key, param="idempotency_key")
    if payload.callback_url is not None:
        try:
            resolve(payload.callback_url, allow_hosts=ctx.settings.webhook_allow_hosts)
        except DestinationRefused as exc:
            raise ApiError(
                400, str(exc), code="invalid_callback_url", param="callback_url"
            ) from None
    key = idempotency_key or payload.idempotency_key
    digest = hashlib.sha256(
        json.dumps(
            [
                endpoint,
                body,
                payload.priority,
                payload.custom_id,
                payload.callback_url,
                payload.queue_class,
            ],
            sort_keys=True,
            default=str,
        ).encode()
    ).hexdigest()
    if key:
        replay = _replay(ctx, tenant, key, digest)
        if replay is not None:
            return replay
    admit_or_refuse(ctx, payload.queue_class)  # 429/503 before anything is written or counted
    check_job_quotas(ctx, tenant)  # 429 over the tenant's quotas
    job = NewJob(
        request={"url": endpoint, "body": body},
        tenant=tenant,
        queue_class=payload.queue_class,
        priority=payload.priority,
        custom_id=payload.custom_id,
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
                callback_url=payload.callback_url,
            )
    except NotPublished:
        pass  # committed: the job is durable and the reconciler publishes it
    except IntegrityError:
        replay = _replay(ctx, tenant, key, digest) if key else None
        if replay is None:
            raise
        return replay
    return JSONResponse(_view(ctx, _owned_job(ctx, tenant, job.id)), status_code=201)


@router.get("/{job_id}", operation_id="getJob")
def get_one(*, job_id: str, ctx: CtxDep, tenant: TenantDep) -> dict[str, Any]:
    """A job: status, timeline, result (the OpenAI response body) and usage."""
    known_id("job", job_id)
    with ctx.reads() as session:
        found = get_job_with_meta(session=session, job_id=job_id)
    if found is None or found[0].tenant != tenant:
        raise not_found("job", job_id)
    return job_view(found[0], model_name=ctx.settings.model_name, meta=found[1])


def _refuse_offset(offset: str | None) -> None:
    """400 for the retired ``offset``: silently ignoring it would answer page 1 again."""
    if offset is not None:
        raise ApiError(
            400,
            "offset is not supported: the listing pages with a cursor; pass after=<last_id "
            "of the previous page> (has_more tells whether there is one)",
            code="unsupported_field",
            param="offset",
        )


@router.get("", operation_id="listJobs")
def list_all(
    *,
    status: JobStatusName | None = None,
    batch_id: str | None = Query(None, max_length=64),
    limit: int = Query(100, ge=1, le=1000),
    after: str | None = Query(None, max_length=64),
    offset: str | None = Query(None, include_in_schema=False),
    ctx: CtxDep,
    tenant: TenantDep,
) -> dict[str, Any]:
    """The tenant's jobs in queue order, filtered by status and batch (cursor: ``after`` =
    last id seen, one of the tenant's own jobs)."""
    _refuse_offset(offset)
    if batch_id is not None:
        owned_batch(ctx, tenant, batch_id, param="batch_id")
    if after is not None:
        _owned_job(ctx, tenant, after, param="after")
    with ctx.session_factory() as session:
        rows = list_jobs(
            session=session,
            status=status,
            tenant=tenant,
            batch_id=batch_id,
            limit=limit + 1,
            after=after,
        )
    has_more = len(rows) > limit
    rows = rows[:limit]
    return {
        "object": "list",
        "data": [job_view(j, model_name=ctx.settings.model_name, full=False) for j in rows],
        "first_id": rows[0].id if rows else None,
        "last_id": rows[-1].id if rows else None,
        "has_more": has_more,
    }


@router.delete("/{job_id}", operation_id="cancelJob")
def cancel(*, job_id: str, ctx: CtxDep, tenant: TenantDep) -> dict[str, Any]:
    """Cancel a job: a queued one ends at once; a running one is aborted by its worker
    between engine steps (its KV blocks freed) and ends ``cancelled``."""
    _owned_job(ctx, tenant, job_id)
    request_cancel(
        session_factory=ctx.session_factory, redis_client=ctx.redis, keys=ctx.keys, job_id=job_id
    )
    return _view(ctx, _owned_job(ctx, tenant, job_id))
