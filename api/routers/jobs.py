"""Jobs: submit (idempotent), get, list, cancel."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Header, Query
from fastapi.responses import JSONResponse

from api.context import Context
from api.control.estimate import price, request_work
from api.control.submit import Submission, new_job, submit_job
from api.deps import CtxDep, TenantDep
from api.errors import ApiError, known_id, not_found
from api.openapi_links import links_to
from api.ownership import owned_batch
from api.schemas import JobCreate, JobObject
from api.views import job_view
from worker.jobs.cancel import request_cancel
from worker.store.crud.api_jobs import get_api_job, get_job_with_meta
from worker.store.crud.jobs import get_job, list_jobs
from worker.store.models import Job

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


@router.post(
    "",
    status_code=201,
    operation_id="createJob",
    responses={
        200: {"description": "idempotent replay; or, with ``dry_run``, the estimate "
                             "(``job.quote``)"},
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
    """Submit one chat-completions or completions request as a job. With ``dry_run`` the
    request is checked as a submission is and answered with its estimate (200,
    ``job.quote``); nothing is created, counted or published."""
    sub = Submission.of_job(payload, tenant=tenant, key_header=idempotency_key)
    if payload.dry_run:
        checked = new_job(ctx, sub)
        quote = price(ctx, tenant, request_work(ctx, [checked.request]),
                      model=str(checked.job.model), window=None, due_at=checked.job.deadline,
                      interactive=payload.queue_class == "interactive")
        return JSONResponse({"object": "job.quote", "queue_class": payload.queue_class,
                             **quote.view()}, status_code=200)
    done = submit_job(ctx, sub)
    view = job_view(done.job, model_name=ctx.settings.model_name, meta=done.meta,
                    request=(done.request.endpoint, done.request.body))
    if done.replayed:
        return JSONResponse(view, status_code=200, headers={"Idempotent-Replayed": "true"})
    return JSONResponse(view, status_code=201)


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
