"""Expand a batch: stream its input file, validate each line, insert job rows and XADD
them in chunks. Invalid lines go to the error file; progress shows in request_counts."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import redis
from sqlalchemy import select

from api.context import Context
from api.control.batch_ids import line_job_id
from api.control.staging import append_errors
from api.errors import ApiError
from api.limits import check_request_limits
from worker.protocol.openai_batch import RequestParseError, format_error_line, parse_request_line
from worker.queue.message import JobMessage
from worker.queue.producer import publish
from worker.store.crud.batch_admin import cancel_queued_jobs, get_progress, set_batch_status
from worker.store.crud.batches import get_batch
from worker.store.crud.files import get_file
from worker.store.crud.jobs import create_jobs
from worker.store.models import Batch, Job
from worker.store.schemas import NewJob

log = logging.getLogger(__name__)


@dataclass
class _Chunk:
    jobs: list[NewJob] = field(default_factory=list)
    errors: list[tuple[int, str]] = field(default_factory=list)
    last_line: int = 0


def expand_batch(ctx: Context, *, batch_id: str) -> str:
    """Expand (or resume expanding) a batch; returns its status afterwards."""
    with ctx.session_factory() as session:
        batch = get_batch(session=session, batch_id=batch_id)
        if batch is None:
            return "missing"
        if batch.status not in ("validating", "in_progress"):
            return batch.status
        progress = get_progress(session=session, batch_id=batch_id)
        if progress.expanded:
            return batch.status
        start_after = progress.lines_read
        f = get_file(session=session, file_id=batch.input_file_id or "", tenant=batch.tenant)
        seen_ids = set(session.scalars(select(Job.custom_id).where(Job.batch_id == batch_id)))
        endpoint, tenant = batch.endpoint, batch.tenant
        session.commit()
    if f is None:
        _fail(ctx, batch_id, "input_file_missing", "the input file no longer exists")
        return "failed"
    chunk = _Chunk()
    line_no = 0
    with open(f.path, "rb") as src:
        for raw in src:
            line_no += 1
            if line_no <= start_after:
                continue
            if not raw.strip():
                chunk.last_line = line_no
                continue
            if line_no > ctx.settings.max_batch_lines:
                _fail(
                    ctx,
                    batch_id,
                    "too_many_lines",
                    f"the file has more than {ctx.settings.max_batch_lines} requests",
                )
                return "failed"
            _take_line(
                ctx,
                chunk,
                raw,
                line_no,
                batch_id=batch_id,
                endpoint=endpoint,
                tenant=tenant,
                seen_ids=seen_ids,
            )
            if len(chunk.jobs) + len(chunk.errors) >= ctx.settings.expand_chunk:
                if not _commit_chunk(ctx, batch_id, chunk):
                    return "cancelling"
                chunk = _Chunk()
    chunk.last_line = max(chunk.last_line, line_no)
    if not _commit_chunk(ctx, batch_id, chunk, final=True):
        return "cancelling"
    with ctx.session_factory() as session:
        batch = get_batch(session=session, batch_id=batch_id)
        empty = batch is not None and not batch.request_total
    if empty:
        _fail(ctx, batch_id, "empty_file", "the input file has no requests")
        return "failed"
    with ctx.session_factory() as session:
        batch = get_batch(session=session, batch_id=batch_id)
        return batch.status if batch else "missing"


def _take_line(
    ctx: Context,
    chunk: _Chunk,
    raw: bytes,
    line_no: int,
    *,
    batch_id: str,
    endpoint: str,
    tenant: str,
    seen_ids: set[str | None],
) -> None:
    chunk.last_line = line_no
    custom_id = None
    try:
        req = parse_request_line(raw, line_number=line_no)
        custom_id = req.custom_id
        if req.endpoint != endpoint:
            raise RequestParseError(
                f"url {req.endpoint!r} differs from the batch's endpoint {endpoint!r}",
                param="url",
                line_number=line_no,
                custom_id=custom_id,
            )
        if custom_id is None:
            custom_id = f"line-{line_no}"
        if "\x00" in custom_id or len(custom_id) > 512:
            raise RequestParseError(
                "custom_id must be at most 512 characters, without NUL",
                param="custom_id",
                line_number=line_no,
                custom_id=None,
            )
        if custom_id in seen_ids:
            raise RequestParseError(
                f"duplicate custom_id {custom_id!r}; custom_id must be unique within a batch",
                param="custom_id",
                code="duplicate_custom_id",
                line_number=line_no,
                custom_id=custom_id,
            )
        check_request_limits(
            req,
            max_prompt_tokens=ctx.settings.max_prompt_tokens,
            max_tokens_limit=ctx.settings.max_tokens_limit,
            max_model_len=ctx.settings.max_model_len,
        )
    except RequestParseError as exc:
        chunk.errors.append(
            (
                line_no,
                format_error_line(
                    custom_id=exc.custom_id or custom_id,
                    request_id=line_job_id(batch_id, line_no),
                    message=str(exc),
                    code=exc.code,
                    param=exc.param,
                ),
            )
        )
        return
    except ApiError as exc:
        chunk.errors.append(
            (
                line_no,
                format_error_line(
                    custom_id=custom_id,
                    request_id=line_job_id(batch_id, line_no),
                    message=f"line {line_no}: {exc.message}",
                    code=exc.code or "invalid_request",
                    param=exc.param,
                ),
            )
        )
        return
    seen_ids.add(custom_id)
    chunk.jobs.append(
        NewJob(
            id=line_job_id(batch_id, line_no),
            request={"url": endpoint, "body": req.body},
            tenant=tenant,
            queue_class="batch",
            priority=0,
            custom_id=custom_id,
            batch_id=batch_id,
        )
    )


def _commit_chunk(ctx: Context, batch_id: str, chunk: _Chunk, *, final: bool = False) -> bool:
    """Insert the chunk's jobs and progress in one transaction, then publish. False when
    the batch is no longer expandable (cancelled meanwhile)."""
    append_errors(ctx, batch_id, chunk.errors)
    with ctx.session_factory.begin() as session:
        # row lock: a concurrent cancel either lands before this chunk (which then stops)
        # or after it (and then sees, and cancels, this chunk's jobs)
        batch = session.get(Batch, batch_id, with_for_update=True)
        if batch is None or batch.status not in ("validating", "in_progress"):
            return False
        create_jobs(session=session, jobs=chunk.jobs)
        progress = get_progress(session=session, batch_id=batch_id)
        progress.lines_read = max(progress.lines_read, chunk.last_line)
        progress.invalid_lines += len(chunk.errors)
        batch.request_total = (batch.request_total or 0) + len(chunk.jobs) + len(chunk.errors)
        if final:
            progress.expanded = 1
        if batch.status == "validating":
            set_batch_status(session=session, batch_id=batch_id, status="in_progress")
    msgs = [
        ("batch", JobMessage(job_id=j.id, body=j.request, tenant=j.tenant, priority=j.priority))
        for j in chunk.jobs
    ]
    try:
        publish(redis_client=ctx.redis, keys=ctx.keys, messages=msgs)
    except redis.RedisError:
        log.warning(
            "batch %s: %d jobs committed but not published; the reconciler will",
            batch_id,
            len(msgs),
        )
    return True


def _fail(ctx: Context, batch_id: str, code: str, message: str) -> None:
    with ctx.session_factory.begin() as session:
        batch = get_batch(session=session, batch_id=batch_id)
        if batch is not None:
            batch.errors = [{"code": code, "message": message, "param": None, "line": None}]
            set_batch_status(session=session, batch_id=batch_id, status="failed")
            cancel_queued_jobs(session=session, batch_id=batch_id)
