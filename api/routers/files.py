"""Files: upload a JSONL batch input (streamed to storage, optionally expiring), read
metadata and content, delete."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, File, Form, Query, Request, UploadFile
from fastapi.responses import StreamingResponse

from api.deps import CtxDep, TenantDep
from api.errors import ApiError, known_id, not_found
from api.openapi_links import links_to
from api.quotas import check_storage_quota, precheck_storage_quota
from api.schemas import EXPIRES_MAX_S, EXPIRES_MIN_S, FileObject
from api.storage import FileTooLarge
from api.views import file_view
from worker.store.crud.files import (
    create_file,
    delete_file,
    get_file,
    list_files,
    new_file_id,
    open_batch_using,
)
from worker.store.crud.tenant_usage import lock_tenant

router = APIRouter(prefix="/v1/files", tags=["files"])

_UPLOAD_FIELDS = frozenset({"file", "purpose", "expires_after[anchor]", "expires_after[seconds]"})


async def _known_form_fields(request: Request) -> None:
    """400 ``unsupported_field`` for a form field the upload does not honour (an
    ``expires_after`` sent some other way than OpenAI's two bracketed fields, say), so
    nothing is dropped silently. The form is the one FastAPI parsed (cached)."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        return
    for name in await request.form():
        if name not in _UPLOAD_FIELDS:
            raise ApiError(
                400,
                f"unknown field {name!r}; an upload takes file, purpose, "
                "expires_after[anchor] and expires_after[seconds]",
                code="unsupported_field",
                param=name,
            )


@router.post(
    "",
    operation_id="uploadFile",
    dependencies=[Depends(_known_form_fields)],
    responses={200: {"description": "the stored file", "model": FileObject,
                     "links": links_to("file_id", "getFile", "getFileContent", "deleteFile")}},
)
def upload(
    *,
    file: Annotated[UploadFile, File()],
    purpose: Annotated[str, Form(json_schema_extra={"enum": ["batch"]})],
    expires_anchor: Annotated[
        str | None, Form(alias="expires_after[anchor]", json_schema_extra={"enum": ["created_at"]})
    ] = None,
    expires_seconds: Annotated[str | None, Form(alias="expires_after[seconds]")] = None,
    ctx: CtxDep,
    tenant: TenantDep,
) -> dict[str, Any]:
    """Upload a file (``purpose=batch``: OpenAI Batch JSONL input). With OpenAI's
    ``expires_after[anchor]=created_at`` and ``expires_after[seconds]`` (3600 to 2592000)
    the file is deleted that long after its creation (unless a batch still reads it)."""
    if purpose != "batch":
        raise ApiError(
            400,
            f"purpose {purpose!r} is not supported; use 'batch'",
            code="invalid_value",
            param="purpose",
        )
    expires_after = _expires_after(expires_anchor, expires_seconds)
    if file.size is not None:  # the upload's size, known once it was received
        precheck_storage_quota(ctx, tenant, file.size)
    file_id = new_file_id()
    try:
        path, size = ctx.storage.save_stream(
            tenant=tenant, file_id=file_id, src=file.file, limit=ctx.settings.max_file_bytes
        )
    except FileTooLarge as exc:
        raise ApiError(413, str(exc), code="file_too_large", param="file") from None
    if size == 0:
        path.unlink(missing_ok=True)
        raise ApiError(400, "the file is empty", code="empty_file", param="file")
    name = _safe_filename(file.filename)
    try:
        with ctx.session_factory.begin() as session:
            check_storage_quota(ctx, session, tenant, size)  # 429, exact under the tenant's lock
            row = create_file(
                session=session,
                file_id=file_id,
                tenant=tenant,
                purpose=purpose,
                filename=name,
                size=size,
                path=str(path),
                expires_after=expires_after,
            )
    except Exception:
        path.unlink(missing_ok=True)  # refused or not recorded: keep no orphan bytes
        raise
    return file_view(row)


@router.get("", operation_id="listFiles")
def list_all(
    *, limit: int = Query(100, ge=1, le=1000), ctx: CtxDep, tenant: TenantDep
) -> dict[str, Any]:
    """The tenant's files, newest first."""
    with ctx.session_factory() as session:
        rows = list_files(session=session, tenant=tenant, limit=limit)
    return {"object": "list", "data": [file_view(r) for r in rows]}


@router.get("/{file_id}", operation_id="getFile")
def get_one(*, file_id: str, ctx: CtxDep, tenant: TenantDep) -> dict[str, Any]:
    """A file's metadata."""
    known_id("file", file_id)
    with ctx.session_factory() as session:
        row = get_file(session=session, file_id=file_id, tenant=tenant)
    if row is None:
        raise not_found("file", file_id)
    return file_view(row)


@router.get(
    "/{file_id}/content",
    operation_id="getFileContent",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/jsonl": {}}}},
)
def content(*, file_id: str, ctx: CtxDep, tenant: TenantDep) -> StreamingResponse:
    """A file's bytes, streamed."""
    known_id("file", file_id)
    with ctx.session_factory() as session:
        row = get_file(session=session, file_id=file_id, tenant=tenant)
    if row is None:
        raise not_found("file", file_id)
    return StreamingResponse(
        ctx.storage.iter_bytes(row.path),
        media_type="application/jsonl",
        headers={"Content-Length": str(row.bytes)},
    )


@router.delete("/{file_id}", operation_id="deleteFile")
def delete(*, file_id: str, ctx: CtxDep, tenant: TenantDep) -> dict[str, Any]:
    """Delete a file and its bytes (freeing the tenant's stored-bytes quota). 409
    ``file_in_use`` while a batch that has not ended reads it as its input."""
    known_id("file", file_id)
    with ctx.session_factory.begin() as session:
        # the tenant's lock: a batch being created from this file (POST /v1/batches takes
        # it too) either committed before, and is seen here, or sees the file gone
        lock_tenant(session=session, tenant=tenant)
        if get_file(session=session, file_id=file_id, tenant=tenant) is None:
            raise not_found("file", file_id)
        batch_id = open_batch_using(session=session, file_id=file_id)
        if batch_id is not None:
            raise ApiError(
                409,
                f"file {file_id!r} is the input of batch {batch_id!r}, which has not ended; "
                "delete it once the batch is completed, failed, expired or cancelled",
                code="file_in_use",
                param="file_id",
            )
        path = delete_file(session=session, file_id=file_id)
    if path:
        ctx.storage.remove(path)
    return {"id": file_id, "object": "file", "deleted": True}


def _expires_after(anchor: str | None, seconds: str | None) -> int | None:
    """The seconds of an upload's ``expires_after`` (None without one); 400 unless both
    fields are given, the anchor is ``created_at`` and the seconds within OpenAI's bounds."""
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise ApiError(
            400,
            "expires_after[anchor] must be 'created_at' (with expires_after[seconds])",
            code="invalid_value",
            param="expires_after[anchor]",
        )
    try:
        n = int(seconds or "")
    except ValueError:
        n = -1
    if not EXPIRES_MIN_S <= n <= EXPIRES_MAX_S:
        raise ApiError(
            400,
            f"expires_after[seconds] must be an integer from {EXPIRES_MIN_S} (one hour) to "
            f"{EXPIRES_MAX_S} (30 days)",
            code="invalid_value",
            param="expires_after[seconds]",
        )
    return n


def _safe_filename(name: str | None) -> str:
    """The uploaded name, at most 512 characters, without control characters or
    characters UTF-8 cannot store (replaced by ``_``)."""
    raw = (name or "upload.jsonl")[:512]
    cleaned = "".join(
        "_" if ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) <= 0xDFFF else c for c in raw
    )
    return cleaned or "upload.jsonl"
