"""Expand a batch: stream its input file, validate each line, insert job rows and XADD
them in chunks. Invalid lines go to the error file; progress shows in request_counts.

Crash-safe: each chunk's job rows, the line offset after it and the renewed expansion lease
commit in one transaction, so a killed expansion leaves a prefix of the file expanded and an
expiring lease; the control plane's ``resume_expansions`` picks it up after the lease expired
(job ids are deterministic per line, so a replayed line cannot make a second job)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import select

from api.context import Context
from api.control.batch_ids import line_job_id
from api.control.input_lines import capped_lines, count_lines
from api.control.models import model_of_batch_file
from api.control.staging import append_errors, staging_path
from api.control.submit import LineError, Submission, new_job
from api.errors import ApiError
from worker.jobs.cancel import cancel_queued_of_batch
from worker.jobs.enqueue import JobWrite, NotPublished, enqueuing
from worker.protocol.openai_batch import format_error_line
from worker.store.base import utcnow
from worker.store.crud.batch_admin import (
    ENDED,
    get_progress,
    hold_expandable,
    set_batch_status,
)
from worker.store.crud.batches import get_batch
from worker.store.crud.expansion import (
    EXPANDABLE,
    claim_expansion,
    holds_lease,
    release_expansion,
)
from worker.store.crud.files import get_file
from worker.store.models import Batch, Job
from worker.store.schemas import NewJob

log = logging.getLogger(__name__)


@dataclass
class _Chunk:
    jobs: list[NewJob] = field(default_factory=list)
    errors: list[tuple[int, str]] = field(default_factory=list)
    last_line: int = 0


def expand_batch(ctx: Context, *, batch_id: str) -> str:
    """Expand (or resume expanding) a batch under its expansion lease; returns its status
    afterwards, or ``busy`` when a live expansion elsewhere holds the lease. Safe to run
    again at any point: it starts after the last committed chunk."""
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    with ctx.session_factory.begin() as session:
        claim = claim_expansion(
            session=session,
            batch_id=batch_id,
            owner=owner,
            ttl=timedelta(seconds=ctx.settings.expand_lease),
            max_attempts=ctx.settings.expand_max_attempts,
        )
        start_after = get_progress(session=session, batch_id=batch_id).lines_read
        batch = get_batch(session=session, batch_id=batch_id)
        if claim == "claimed":
            assert batch is not None
            f = get_file(session=session, file_id=batch.input_file_id or "", tenant=batch.tenant)
            seen_ids = set(session.scalars(select(Job.custom_id).where(Job.batch_id == batch_id)))
            reader = _Reader(ctx, batch_id, owner, batch.endpoint, batch.tenant, seen_ids,
                             batch.model, batch.expires_at)
    if claim == "exhausted":
        _fail(ctx, batch_id, "expansion_failed",
              f"the expansion failed {ctx.settings.expand_max_attempts} times in a row after "
              f"line {start_after} (INFLIGHT_EXPAND_MAX_ATTEMPTS)")
        return _status(ctx, batch_id)
    if claim != "claimed":
        return claim if claim in ("busy", "missing") or batch is None else batch.status
    try:
        if f is None:
            _fail(ctx, batch_id, "input_file_missing", "the input file no longer exists")
        elif reader.find_model(f.path):
            reader.read(f.path, start_after)
    finally:
        with contextlib.suppress(Exception), ctx.session_factory.begin() as session:
            release_expansion(session=session, batch_id=batch_id, owner=owner)
    return _status(ctx, batch_id)


def _status(ctx: Context, batch_id: str) -> str:
    with ctx.session_factory() as session:
        batch = get_batch(session=session, batch_id=batch_id)
        return batch.status if batch else "missing"


@dataclass
class _Reader:
    """One expansion run: reads the file from a line on, commits chunk after chunk."""

    ctx: Context
    batch_id: str
    owner: str
    endpoint: str
    tenant: str
    seen_ids: set[str | None]
    model: str | None  # every line runs on it (api.control.models)
    deadline: datetime | None  # every line's: created_at + completion_window

    def find_model(self, path: str) -> bool:
        """The batch's model, found from its file for a batch from before revision 0014
        (created without one); False when that fails the batch (no worker serves it)."""
        if self.model is None:
            try:
                self.model = model_of_batch_file(self.ctx, path)
            except ApiError as exc:
                _fail(self.ctx, self.batch_id, exc.code or "model_not_found", exc.message)
                return False
        return True

    def read(self, path: str, start_after: int) -> None:
        """Read every line after ``start_after``; stop early when the batch failed, was
        cancelled or another expansion took the lease over. A file with more lines than
        ``max_batch_lines`` fails before its first job is queued; a line longer than
        ``max_batch_line_bytes`` is that line's error, never parsed."""
        settings = self.ctx.settings
        if start_after == 0:
            n = count_lines(path, stop_after=settings.max_batch_lines)
            if n > settings.max_batch_lines:
                _fail(self.ctx, self.batch_id, "too_many_lines",
                      f"the file has more than {settings.max_batch_lines} lines")
                return
        chunk = _Chunk()
        line_no = 0
        with open(path, "rb") as src:
            for raw, size in capped_lines(src, max_bytes=settings.max_batch_line_bytes):
                line_no += 1
                if line_no <= start_after:
                    continue
                if raw is not None and not raw.strip():
                    chunk.last_line = line_no
                    continue
                if line_no > settings.max_batch_lines:
                    _fail(
                        self.ctx,
                        self.batch_id,
                        "too_many_lines",
                        f"the file has more than {settings.max_batch_lines} lines",
                    )
                    return
                if raw is None:
                    _line_too_long(chunk, self.batch_id, line_no, size,
                                   settings.max_batch_line_bytes)
                else:
                    _take_line(
                        self.ctx,
                        chunk,
                        raw,
                        line_no,
                        batch_id=self.batch_id,
                        endpoint=self.endpoint,
                        tenant=self.tenant,
                        seen_ids=self.seen_ids,
                        model=self.model,
                        deadline=self.deadline,
                    )
                if len(chunk.jobs) + len(chunk.errors) >= settings.expand_chunk:
                    if not _commit_chunk(self.ctx, self.batch_id, chunk, owner=self.owner):
                        return
                    chunk = _Chunk()
        chunk.last_line = max(chunk.last_line, line_no)
        _commit_chunk(self.ctx, self.batch_id, chunk, owner=self.owner, final=True)


def _line_too_long(chunk: _Chunk, batch_id: str, line_no: int, size: int, limit: int) -> None:
    """The error line of an input line over the byte limit (its custom_id is unknown: the
    line is not parsed)."""
    chunk.last_line = line_no
    chunk.errors.append(
        (
            line_no,
            format_error_line(
                custom_id=None,
                request_id=line_job_id(batch_id, line_no),
                message=f"line {line_no}: {size} bytes, over the limit of {limit} bytes "
                "per line (INFLIGHT_MAX_BATCH_LINE_BYTES)",
                code="line_too_long",
                param=None,
            ),
        )
    )


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
    model: str | None,
    deadline: datetime | None,
) -> None:
    """One line through the submission path: its job (on the batch's ``model``, due at the
    batch's ``deadline``), or its error record."""
    chunk.last_line = line_no
    line = Submission(
        tenant=tenant,
        request=raw,
        line_no=line_no,
        endpoint=endpoint,
        queue_class="batch",
        batch_id=batch_id,
        job_id=line_job_id(batch_id, line_no),
        model=model,
        deadline=deadline,
    )
    try:
        chunk.jobs.append(new_job(ctx, line, seen_ids).job)
    except LineError as exc:
        chunk.errors.append(
            (
                line_no,
                format_error_line(
                    custom_id=exc.custom_id,
                    request_id=line.job_id,
                    message=exc.message,
                    code=exc.code,
                    param=exc.param,
                ),
            )
        )
    except Exception:  # a line that breaks the checks fails alone, not its whole batch
        log.exception("batch %s: line %d could not be checked", batch_id, line_no)
        chunk.errors.append((line_no, format_error_line(
            custom_id=None, request_id=line.job_id, code="internal_error", status_code=500,
            message=f"line {line_no}: the request could not be checked; try it again")))


def _commit_chunk(
    ctx: Context, batch_id: str, chunk: _Chunk, *, owner: str, final: bool = False
) -> bool:
    """Insert the chunk's jobs, advance ``lines_read`` past it and renew the lease in one
    transaction, then publish. False when the batch is no longer expandable (cancelled
    meanwhile) or the lease was lost (another expansion took over after it expired)."""
    append_errors(ctx, batch_id, chunk.errors)  # keyed by line: a replayed chunk overwrites
    try:
        with enqueuing(
            session_factory=ctx.session_factory,
            redis_client=ctx.redis,
            keys=ctx.keys,
            jobs=chunk.jobs,
        ) as write:
            go_on = _record_chunk(ctx, write, batch_id, chunk, owner=owner, final=final)
    except NotPublished:
        return True  # committed: the reconciler publishes the chunk's jobs
    if not go_on and chunk.errors:
        _drop_orphan_staging(ctx, batch_id)
    return go_on


def _drop_orphan_staging(ctx: Context, batch_id: str) -> None:
    """A chunk refused after its errors were staged: when the batch has ended (its
    finalizer already wrote the error file and removed the staging file, or it failed
    and gets none), the staging file these errors re-created is nobody's; remove it."""
    with ctx.session_factory() as session:
        batch = get_batch(session=session, batch_id=batch_id)
        ended = batch is None or batch.status in ENDED
    if ended:
        staging_path(ctx, batch_id).unlink(missing_ok=True)


def _record_chunk(
    ctx: Context, write: JobWrite, batch_id: str, chunk: _Chunk, *, owner: str, final: bool
) -> bool:
    """The chunk's writes inside the enqueue transaction (see :func:`_commit_chunk`)."""
    session = write.session
    # row held: a concurrent cancel or expiry either lands before this chunk (which then
    # stops) or after it (and then sees, and cancels, this chunk's jobs)
    if not hold_expandable(session=session, batch_id=batch_id):
        return False
    batch = session.get(Batch, batch_id, populate_existing=True)
    assert batch is not None
    progress = get_progress(session=session, batch_id=batch_id)
    if not holds_lease(progress=progress, owner=owner):
        log.warning(
            "batch %s: expansion lease lost to %s; stopping", batch_id, progress.lease_owner
        )
        return False
    write.insert()
    progress.lines_read = max(progress.lines_read, chunk.last_line)
    progress.expand_attempts = 0  # progress made: the next failure counts from here
    progress.invalid_lines += len(chunk.errors)
    progress.lease_until = utcnow() + timedelta(seconds=ctx.settings.expand_lease)
    batch.request_total = (batch.request_total or 0) + len(chunk.jobs) + len(chunk.errors)
    if final and not batch.request_total:
        batch.errors = [_error("empty_file", "the input file has no requests")]
        set_batch_status(session=session, batch_id=batch_id, status="failed")
        return False
    if final:
        progress.expanded = 1
    if batch.status == "validating":
        set_batch_status(session=session, batch_id=batch_id, status="in_progress")
    return True


def _fail(ctx: Context, batch_id: str, code: str, message: str) -> None:
    """Fail a batch that is still expandable (validating or in progress) and cancel its
    queued jobs; a batch already ended, cancelling or finalizing keeps its status."""
    with ctx.session_factory.begin() as session:
        batch = session.get(Batch, batch_id, with_for_update=True)
        if batch is None or not set_batch_status(
            session=session, batch_id=batch_id, status="failed", only_from=EXPANDABLE
        ):
            return
        batch.errors = [_error(code, message)]
        cancel_queued_of_batch(session=session, batch_id=batch_id)
    staging_path(ctx, batch_id).unlink(missing_ok=True)  # a failed batch has no error file


def _error(code: str, message: str) -> dict[str, object]:
    return {"code": code, "message": message, "param": None, "line": None}
