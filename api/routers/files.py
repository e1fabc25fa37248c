"""Files: upload a JSONL batch input (streamed to storage), read metadata and content."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Query, UploadFile
from fastapi.responses import StreamingResponse

from api.deps import CtxDep, TenantDep
from api.errors import ApiError, known_id, not_found
from api.openapi_links import links_to
from api.quotas import check_storage_quota
from api.schemas import FileObject
from api.storage import FileTooLarge
from api.views import file_view
from worker.store.crud.files import create_file, get_file, list_files, new_file_id

router = APIRouter(prefix="/v1/files", tags=["files"])


@router.post(
    "",
    operation_id="uploadFile",
    responses={200: {"description": "the stored file", "model": FileObject,
                     "links": links_to("file_id", "getFile", "getFileContent")}},
)
def upload(
    *,
    file: Annotated[UploadFile, File()],
    purpose: Annotated[str, Form(json_schema_extra={"enum": ["batch"]})],
    ctx: CtxDep,
    tenant: TenantDep,
) -> dict[str, Any]:
    """Upload a file (``purpose=batch``: OpenAI Batch JSONL input)."""
    if purpose != "batch":
        raise ApiError(
            400,
            f"purpose {purpose!r} is not supported; use 'batch'",
            code="invalid_value",
            param="purpose",
        )
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


def _safe_filename(name: str | None) -> str:
    """The uploaded name, at most 512 characters, without control characters or
    characters UTF-8 cannot store (replaced by ``_``)."""
    raw = (name or "upload.jsonl")[:512]
    cleaned = "".join(
        "_" if ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) <= 0xDFFF else c for c in raw
    )
    return cleaned or "upload.jsonl"
