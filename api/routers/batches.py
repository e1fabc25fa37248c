"""Batches with OpenAI Batch API semantics: create, get, cancel, list; and retry (a new
batch of a finished batch's failed and expired lines)."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Body, Header, Query, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api.admission import admit_or_refuse
from api.context import Context
from api.control.celery_app import send
from api.control.estimate import Quote, admit, batch_work, price
from api.control.input_lines import count_lines
from api.control.models import model_of_batch_file, resolve_model
from api.control.retry_lines import write_retry_file
from api.control.submit import check_callback_url
from api.deps import CtxDep, TenantDep
from api.errors import ApiError, idempotency_key_reused, known_id, not_found
from api.openapi_links import links_to
from api.ownership import owned_batch
from api.quotas import check_batch_quota, check_queued_jobs, check_storage_quota
from api.schemas import BatchCreate, BatchObject, BatchRetry
from api.views import batch_view
from worker.protocol.limits import check_id
from worker.store.base import utcnow
from worker.store.crud.batch_admin import get_progress, list_batches
from worker.store.crud.batches import create_batch, find_by_idempotency_key
from worker.store.crud.files import create_file, get_file, new_file_id
from worker.store.crud.jobs import count_by_status
from worker.store.crud.tenant_usage import lock_tenant
from worker.store.crud.usage import batch_usage
from worker.store.models import Batch

router = APIRouter(prefix="/v1/batches", tags=["batches"])

_LIVE = ("validating", "in_progress", "cancelling", "finalizing")


def _owned(ctx: Context, tenant: str, batch_id: str) -> Batch:
    return owned_batch(ctx, tenant, batch_id)


def _live_view(ctx: Context, batch: Batch) -> tuple[dict[str, Any], bool]:
    """The batch object with request counts and usage as of now, and whether it can be
    finalized."""
    if batch.status not in _LIVE:
        if batch.usage is None:  # ended without a finalize (failed at expansion)
            with ctx.reads() as session:
                return batch_view(batch, usage=batch_usage(session=session,
                                                           batch_id=batch.id)), False
        return batch_view(batch), False
    with ctx.session_factory() as session:
        counts = count_by_status(session=session, batch_id=batch.id)
        usage = batch_usage(session=session, batch_id=batch.id)
        progress = get_progress(session=session, batch_id=batch.id)  # may add a row: last
        invalid, expanded = progress.invalid_lines or 0, bool(progress.expanded)
        session.rollback()
    failed = counts.get("failed", 0) + counts.get("cancelled", 0) + invalid
    live = {"total": batch.request_total, "completed": counts.get("succeeded", 0), "failed": failed}
    open_jobs = counts.get("queued", 0) + counts.get("running", 0)
    ready = open_jobs == 0 and (expanded or batch.status == "cancelling")
    return batch_view(batch, live, usage), ready and batch.status != "validating"


def _input_path(session: Session, tenant: str, file_id: str) -> str:
    """The path of the tenant's batch input file ``file_id``; 404 when absent, 400 when
    its purpose is not ``batch``."""
    f = get_file(session=session, file_id=file_id, tenant=tenant)
    if f is None:
        raise not_found("file", file_id, param="input_file_id")
    if f.purpose != "batch":
        raise ApiError(
            400,
            f"file {f.id!r} has purpose {f.purpose!r}; a batch input needs purpose 'batch'",
            code="invalid_value",
            param="input_file_id",
        )
    return f.path


class _KeyTaken(Exception):
    """The idempotency key has a batch already (found under the tenant's lock)."""


def _digest(payload: BatchCreate) -> str:
    """What an idempotency key is bound to: every field of the request, defaults included
    (an omitted ``completion_window`` and ``"24h"`` are the same request)."""
    body = payload.model_dump(mode="json")
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _replayed(ctx: Context, tenant: str, key: str, digest: str) -> Batch | None:
    """The batch an earlier request with ``key`` created (409 if its request differed)."""
    with ctx.session_factory() as session:
        batch = find_by_idempotency_key(session=session, tenant=tenant, key=key)
    if batch is None:
        return None
    if batch.request_digest != digest:
        raise idempotency_key_reused(key, param="Idempotency-Key")
    return batch


def _replay(ctx: Context, batch: Batch) -> JSONResponse:
    """The earlier batch, as it is now, marked as a replay."""
    view = _live_view(ctx, batch)[0]
    return JSONResponse(view, status_code=200, headers={"Idempotent-Replayed": "true"})


@router.post(
    "",
    operation_id="createBatch",
    responses={200: {"description": "the batch, validating (or, with the header "
                                    "``Idempotent-Replayed: true``, the batch an earlier "
                                    "request with the same Idempotency-Key created)",
                     "model": BatchObject,
                     "headers": {"Idempotent-Replayed": {
                         "description": "``true`` when the answer is an earlier request's "
                                        "batch", "schema": {"type": "string"}}},
                     "links": links_to("batch_id", "getBatch", "cancelBatch")},
               409: {"description": "the Idempotency-Key was already used with a different "
                                    "request (``idempotency_key_reused``)"}},
)
def create(
    *,
    payload: BatchCreate,
    request: Request,
    idempotency_key: str | None = Header(
        None,
        alias="Idempotency-Key",
        max_length=255,
        description="a repeat with the same key and request answers the batch created "
        "first (200, ``Idempotent-Replayed: true``) and creates nothing; the same key with "
        "a different request is a 409. Keys are per tenant.",
    ),
    ctx: CtxDep,
    tenant: TenantDep,
) -> Any:
    """Create a batch from an uploaded JSONL file. Answers ``validating`` at once; its lines
    become jobs in the background (resumed after a crash by the control plane's beat).
    The batch runs on one model, the one its first request names (the default model where
    it names none; 404 ``model_not_found`` when no worker serves it); a later line naming
    another fails alone (``model_mismatch``). Before anything is written the file's lines
    are counted (streamed, nothing kept): more
    than ``max_batch_lines`` is a 400, and the lines count against the queue's bound and
    the tenant's queued-jobs quota like as many job submissions (429 with Retry-After).
    With an ``Idempotency-Key`` a repeat of the request answers the batch the first one
    created (200, ``Idempotent-Replayed: true``) and creates nothing; the same key with a
    different request is a 409 ``idempotency_key_reused``."""
    if payload.dry_run:
        return _quote(ctx, tenant, payload)
    key = idempotency_key
    digest = _digest(payload)
    if key is not None:
        check_id(key, param="Idempotency-Key")
        earlier = _replayed(ctx, tenant, key, digest)
        if earlier is not None:
            return _replay(ctx, earlier)
    check_callback_url(ctx, payload.callback_url)
    path, lines = _counted_input(ctx, tenant, payload.input_file_id)
    model = model_of_batch_file(ctx, path)  # 404/400 when no worker serves it
    admit_or_refuse(ctx, "batch", offered=lines, model=model)  # 429/503, nothing written yet
    quote = price(ctx, tenant, batch_work(ctx, path, payload.endpoint), model=model,
                  window=payload.completion_window)
    admit(ctx, quote)  # 400 completion_window_unmeetable
    try:
        with ctx.session_factory.begin() as session:
            lock_tenant(session=session, tenant=tenant)  # DELETE /v1/files/{id} takes it too
            if key is not None and find_by_idempotency_key(session=session, tenant=tenant,
                                                           key=key):
                raise _KeyTaken  # a concurrent request with the key created it meanwhile
            check_batch_quota(ctx, session, tenant)  # 429, exact under the tenant's lock
            check_queued_jobs(ctx, session, tenant, adding=lines)
            _input_path(session, tenant, payload.input_file_id)  # not deleted meanwhile
            batch_id = _new_batch(
                session,
                tenant,
                endpoint=payload.endpoint,
                model=model,
                input_file_id=payload.input_file_id,
                completion_window=payload.completion_window,
                metadata=payload.metadata,
                output_expires_after=(
                    payload.output_expires_after.seconds if payload.output_expires_after else None
                ),
                idempotency_key=key,
                request_digest=digest if key is not None else None,
                callback_url=payload.callback_url,
                quote=quote,
            )
    except (_KeyTaken, IntegrityError):
        # a concurrent first request with the same key committed its batch first (seen
        # under the tenant's lock, or by the unique constraint)
        earlier = _replayed(ctx, tenant, key, digest) if key is not None else None
        if earlier is None:
            raise
        return _replay(ctx, earlier)
    view = _live_view(ctx, _owned(ctx, tenant, batch_id))[0]  # as created: validating
    request.app.state.dispatcher.submit("inflight.expand_batch", batch_id)
    return view


def _counted_input(ctx: Context, tenant: str, file_id: str) -> tuple[str, int]:
    """The path of the tenant's batch input ``file_id`` and its lines; 400
    ``too_many_lines`` past the limit (counted streaming, nothing kept)."""
    known_id("file", file_id, param="input_file_id")
    with ctx.session_factory() as session:
        path = _input_path(session, tenant, file_id)
    lines = count_lines(path, stop_after=ctx.settings.max_batch_lines)
    if lines > ctx.settings.max_batch_lines:
        raise ApiError(
            400,
            f"the file has more than {ctx.settings.max_batch_lines} lines, the limit per "
            "batch; split it into several batches",
            code="too_many_lines",
            param="input_file_id",
        )
    return path, lines


def _quote(ctx: Context, tenant: str, payload: BatchCreate) -> dict[str, Any]:
    """A dry run: the estimate of the batch the request would create (the same checks of
    its file and callback URL), and nothing created, counted or published."""
    check_callback_url(ctx, payload.callback_url)
    path, _ = _counted_input(ctx, tenant, payload.input_file_id)
    model = model_of_batch_file(ctx, path)  # 404/400 as the batch itself would get
    quote = price(ctx, tenant, batch_work(ctx, path, payload.endpoint), model=model,
                  window=payload.completion_window)
    return {"object": "batch.quote", "input_file_id": payload.input_file_id,
            "endpoint": payload.endpoint, **quote.view()}


def _new_batch(
    session: Session,
    tenant: str,
    *,
    endpoint: str,
    model: str,
    input_file_id: str,
    completion_window: str,
    metadata: dict[str, str] | None,
    output_expires_after: int | None,
    retry_of: str | None = None,
    idempotency_key: str | None = None,
    request_digest: str | None = None,
    callback_url: str | None = None,
    quote: Quote | None = None,
) -> str:
    """Add a batch (validating, its window starting now, with its estimate); returns its
    id."""
    batch = create_batch(
        session=session,
        tenant=tenant,
        endpoint=endpoint,
        input_file_id=input_file_id,
        completion_window=completion_window,
        metadata=metadata,
        idempotency_key=idempotency_key,
        request_digest=request_digest,
        callback_url=callback_url,
    )
    batch.created_at = utcnow()
    batch.expires_at = batch.created_at + timedelta(hours=int(completion_window[:-1]))
    batch.output_expires_after = output_expires_after
    batch.retry_of = retry_of
    batch.model = model
    if quote is not None:
        batch.estimate = quote.view()
        batch.estimated_engine_seconds = quote.engine_seconds
        batch.estimated_completion_at = quote.completion_at
    return batch.id


@router.post(
    "/{batch_id}/retry",
    operation_id="retryBatch",
    responses={200: {"description": "the new batch, validating", "model": BatchObject,
                     "links": links_to("batch_id", "getBatch", "cancelBatch")}},
)
def retry(
    *,
    batch_id: str,
    request: Request,
    ctx: CtxDep,
    tenant: TenantDep,
    payload: BatchRetry | None = Body(None),  # noqa: B008
) -> dict[str, Any]:
    """A new batch of exactly the lines of a finished batch that failed, were cancelled or
    expired (those of its error file), with the same custom_ids, so the two output files
    join by custom_id; its input is a new file of those lines (``<batch id>_retry.jsonl``,
    counted against the stored bytes). The endpoint, completion window, metadata and
    output expiry are the batch's unless the body overrides them. The new batch names the
    old one in ``retry_of``. 409 ``batch_not_finished`` while the batch runs, 400
    ``nothing_to_retry`` when none of its lines failed."""
    old = _owned(ctx, tenant, batch_id)
    if old.status in _LIVE:
        raise ApiError(
            409,
            f"batch {batch_id!r} is {old.status}; only a finished batch (completed, failed, "
            "expired or cancelled) can be retried",
            code="batch_not_finished",
            param="batch_id",
        )
    body = payload or BatchRetry.model_validate({})
    model = resolve_model(ctx, old.model) if old.model else None  # 404: no worker serves it
    callback_url = (body.callback_url if "callback_url" in body.model_fields_set
                    else old.callback_url)
    check_callback_url(ctx, callback_url)
    if model is not None:
        admit_or_refuse(ctx, "batch", model=model)
    file_id = new_file_id()
    tmp, path = ctx.storage.writer(tenant=tenant, file_id=file_id)
    try:
        lines, size = write_retry_file(ctx, old, tmp)
        if not lines:
            raise ApiError(
                400,
                f"batch {batch_id!r} has no failed, cancelled or expired request to retry",
                code="nothing_to_retry",
                param="batch_id",
            )
        model = model or model_of_batch_file(ctx, str(tmp))  # a batch from before 0014
        admit_or_refuse(ctx, "batch", offered=lines, model=model)
        quote = price(ctx, tenant, batch_work(ctx, str(tmp), old.endpoint), model=model,
                      window=body.completion_window or old.completion_window)
        admit(ctx, quote)
        tmp.replace(path)
        with ctx.session_factory.begin() as session:
            lock_tenant(session=session, tenant=tenant)
            check_storage_quota(ctx, session, tenant, size)
            check_batch_quota(ctx, session, tenant)
            check_queued_jobs(ctx, session, tenant, adding=lines)
            create_file(session=session, file_id=file_id, tenant=tenant, purpose="batch",
                        filename=f"{batch_id}_retry.jsonl", size=size, path=str(path))
            new_id = _new_batch(
                session,
                tenant,
                endpoint=old.endpoint,
                model=model,
                input_file_id=file_id,
                completion_window=body.completion_window or old.completion_window,
                metadata=body.metadata if "metadata" in body.model_fields_set else old.metadata_,
                output_expires_after=(
                    (body.output_expires_after.seconds if body.output_expires_after else None)
                    if "output_expires_after" in body.model_fields_set
                    else old.output_expires_after
                ),
                retry_of=old.id,
                callback_url=callback_url,
                quote=quote,
            )
    except BaseException:
        tmp.unlink(missing_ok=True)  # refused or not recorded: keep no orphan bytes
        path.unlink(missing_ok=True)
        raise
    view = _live_view(ctx, _owned(ctx, tenant, new_id))[0]
    request.app.state.dispatcher.submit("inflight.expand_batch", new_id)
    return view


@router.get("/{batch_id}", operation_id="getBatch")
def get_one(*, batch_id: str, request: Request, ctx: CtxDep, tenant: TenantDep) -> dict[str, Any]:
    """A batch with its status and request counts (finalized here if it just finished)."""
    view, ready = _live_view(ctx, _owned(ctx, tenant, batch_id))
    if ready:
        send(request.app.state.celery, "inflight.finalize_batch", batch_id)
        view, _ = _live_view(ctx, _owned(ctx, tenant, batch_id))
    return view


@router.post("/{batch_id}/cancel", operation_id="cancelBatch")
def cancel(*, batch_id: str, request: Request, ctx: CtxDep, tenant: TenantDep) -> dict[str, Any]:
    """Cancel a batch: ``cancelling`` now, ``cancelled`` once its running jobs stopped."""
    from api.control.maintenance import mark_cancelling

    batch = _owned(ctx, tenant, batch_id)
    if batch.status in ("cancelling", "cancelled"):
        return _live_view(ctx, batch)[0]
    if not mark_cancelling(ctx, batch_id=batch_id):
        batch = _owned(ctx, tenant, batch_id)  # it moved since it was read: say where to
        if batch.status in ("cancelling", "cancelled"):
            return _live_view(ctx, batch)[0]
        raise ApiError(
            400,
            f"batch {batch_id!r} is {batch.status}; only a validating or "
            "in-progress batch can be cancelled",
            code="invalid_state",
        )
    send(request.app.state.celery, "inflight.cancel_batch", batch_id)
    return _live_view(ctx, _owned(ctx, tenant, batch_id))[0]


@router.get("", operation_id="listBatches")
def list_all(
    *,
    limit: int = Query(20, ge=1, le=100),
    after: str | None = Query(None, max_length=64),
    ctx: CtxDep,
    tenant: TenantDep,
) -> dict[str, Any]:
    """The tenant's batches, newest first (cursor: ``after`` = last id seen, one of the
    tenant's own batches)."""
    if after is not None:
        owned_batch(ctx, tenant, after, param="after")
    with ctx.session_factory() as session:
        rows = list_batches(session=session, tenant=tenant, limit=limit + 1, after=after)
    has_more = len(rows) > limit
    rows = rows[:limit]
    return {
        "object": "list",
        "data": [batch_view(b) for b in rows],
        "first_id": rows[0].id if rows else None,
        "last_id": rows[-1].id if rows else None,
        "has_more": has_more,
    }
