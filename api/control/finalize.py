"""Finalize a batch whose jobs have all ended: output file (succeeded requests) and error
file (invalid lines, failed and cancelled requests), both in input order, in the OpenAI
Batch output-line format; then the batch's final status and request counts.

An expired batch (``finalizing`` with ``expired_at`` set, see
:func:`worker.store.crud.batch_admin.start_expiry`) is finalized at once, its unfinished
requests ``batch_expired``. A batch expired or cancelled before its expansion read the
whole file gets the lines it never read as ``batch_expired`` / ``batch_cancelled`` error
lines, read from the input file: every request line ends in exactly one of the files."""

from __future__ import annotations

import logging
import os
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from api.context import Context
from api.control.batch_ids import line_job_id, line_of_job
from api.control.input_lines import unread_lines
from api.control.staging import read_errors, staging_path
from api.views import response_body
from worker.protocol.openai_batch import (
    format_batch_output_line,
    format_error_line,
    line_custom_id,
)
from worker.queue.lock import RenewableLock
from worker.store.crud.batch_admin import (
    batch_jobs_in_order,
    get_progress,
    open_job_count,
    set_batch_status,
)
from worker.store.crud.batches import get_batch
from worker.store.crud.files import create_file, get_file, new_file_id
from worker.store.crud.usage import UsageTotals
from worker.store.models import Job

_FINAL_OF = {
    "validating": "completed",
    "in_progress": "completed",
    "finalizing": "completed",
    "cancelling": "cancelled",
}
log = logging.getLogger(__name__)

LOCK_TTL_S = 60
"""The finalize lock's lease: renewed with every page of jobs written, so it is held as
long as a finalize runs, and a finalizer that died frees the batch within a minute."""


def finalize_batch(ctx: Context, *, batch_id: str) -> str:
    """Write the output and error files once no job of the batch is open; returns the
    batch's status afterwards (unchanged while jobs are still open). One finalizer at a
    time per batch: ``locked`` when another holds the lock; a finalizer that lost it
    (stalled past its lease) stops before it records anything."""
    lock = RenewableLock(
        ctx.redis, ctx.keys.finalize_lock(batch_id), uuid.uuid4().hex, LOCK_TTL_S
    )
    if not lock.take():
        return "locked"
    try:
        return _finalize(ctx, batch_id, lock)
    finally:
        lock.release()


def _finalize(ctx: Context, batch_id: str, lock: RenewableLock) -> str:
    with ctx.session_factory.begin() as session:
        batch = get_batch(session=session, batch_id=batch_id)
        if batch is None:
            return "missing"
        status = batch.status
        progress = get_progress(session=session, batch_id=batch_id)
        if status not in _FINAL_OF:
            return status
        expiring = status == "finalizing" and batch.expired_at is not None
        if not expiring:
            if status in ("validating", "in_progress") and not progress.expanded:
                return status
            if open_job_count(session=session, batch_id=batch_id):
                return status
        progress.finalize_attempts = (progress.finalize_attempts or 0) + 1  # kept if it fails
        if progress.finalize_attempts > ctx.settings.finalize_max_attempts:
            return _give_up(ctx, session, batch, progress.finalize_attempts - 1)
        if status == "in_progress":
            set_batch_status(session=session, batch_id=batch_id, status="finalizing")
        tenant, expires_after = batch.tenant, batch.output_expires_after
        unread = None if progress.expanded else _Unread.of(session, batch, progress.lines_read)
    final = "expired" if expiring else _FINAL_OF[status]
    out_id, err_id, counts, usage = _write_files(ctx, batch_id, tenant, final, lock,
                                                 expires_after, unread)
    with ctx.session_factory.begin() as session:
        lock.renew()  # still ours: nobody else finalized meanwhile
        batch = get_batch(session=session, batch_id=batch_id)
        assert batch is not None
        batch.output_file_id = out_id
        batch.error_file_id = err_id
        batch.request_total = counts["total"]
        batch.request_completed = counts["completed"]
        batch.request_failed = counts["failed"]
        batch.usage = usage.as_dict()
        set_batch_status(session=session, batch_id=batch_id, status=final)
    staging_path(ctx, batch_id).unlink(missing_ok=True)  # its lines are in the error file now
    return final


def _give_up(ctx: Context, session: Any, batch: Any, attempts: int) -> str:
    """Fail a batch whose files could not be written in ``attempts`` runs (its jobs have
    ended, or had their cancel recorded: nothing of it is left to run); a failed batch
    has no error file, so its staged errors go."""
    batch.errors = [{"code": "finalize_failed", "param": None, "line": None,
                     "message": f"the output files could not be written in {attempts} "
                                "attempts (INFLIGHT_FINALIZE_MAX_ATTEMPTS)"}]
    set_batch_status(session=session, batch_id=batch.id, status="failed")
    staging_path(ctx, batch.id).unlink(missing_ok=True)
    return "failed"


@dataclass(frozen=True)
class _Unread:
    """Where an expansion that never finished stopped: the input file and the last line
    it committed (the lines after it never became a job or an error)."""

    path: str | None
    after: int

    @staticmethod
    def of(session: Any, batch: Any, lines_read: int) -> _Unread:
        f = get_file(session=session, file_id=batch.input_file_id or "", tenant=batch.tenant)
        return _Unread(f.path if f is not None else None, lines_read or 0)


def _write_files(
    ctx: Context, batch_id: str, tenant: str, final: str, lock: RenewableLock,
    expires_after: int | None = None, unread: _Unread | None = None,
) -> tuple[str | None, str | None, dict[str, int], UsageTotals]:
    staged = read_errors(ctx, batch_id)
    usage = UsageTotals()
    out_id, err_id = new_file_id(), new_file_id()
    out_tmp, out_path = ctx.storage.writer(tenant=tenant, file_id=out_id)
    err_tmp, err_path = ctx.storage.writer(tenant=tenant, file_id=err_id)
    counts = {"total": 0, "completed": 0, "failed": 0}
    pending_errors = deque(sorted(staged.items()))  # popleft: O(1) per staged line
    n_out = n_err = 0
    try:
        with open(out_tmp, "w", encoding="utf-8") as out, open(err_tmp, "w", encoding="utf-8") as err:

            def flush_staged(before: int) -> None:
                nonlocal n_err
                while pending_errors and pending_errors[0][0] < before:
                    err.write(pending_errors.popleft()[1] + "\n")
                    n_err += 1
                    counts["failed"] += 1
                    counts["total"] += 1

            after = ""
            while True:
                lock.renew()  # raises when it ran out and another finalizer took the batch
                with ctx.session_factory() as session:
                    jobs = batch_jobs_in_order(session=session, batch_id=batch_id, after_id=after)
                if not jobs:
                    break
                after = jobs[-1].id
                for job in jobs:
                    flush_staged(line_of_job(job.id))
                    counts["total"] += 1
                    usage.add(job)
                    line = _job_line(ctx, job)
                    if job.status == "succeeded" and line is not None:
                        out.write(line + "\n")
                        n_out += 1
                        counts["completed"] += 1
                    else:
                        err.write((line or _failure_line(job, final)) + "\n")
                        n_err += 1
                        counts["failed"] += 1
            if unread is None:
                flush_staged(1 << 62)
            else:  # staged errors past ``after`` are a chunk that never committed
                flush_staged(unread.after + 1)
                for i, (line_no, custom_id) in enumerate(_unread_lines(ctx, unread)):
                    if i % 1000 == 999:
                        lock.renew()
                    request_id = line_job_id(batch_id, line_no)
                    err.write(_unfinished_line(custom_id=custom_id, request_id=request_id,
                                               final=final) + "\n")
                    n_err += 1
                    counts["failed"] += 1
                    counts["total"] += 1
        lock.renew()
    except BaseException:  # lost the lock (or failed): leave no temporary file behind
        out_tmp.unlink(missing_ok=True)
        err_tmp.unlink(missing_ok=True)
        raise
    with ctx.session_factory.begin() as session:
        out_file = _publish(session, tenant, out_id, out_tmp, out_path,
                            f"{batch_id}_output.jsonl", n_out, expires_after)
        err_file = _publish(session, tenant, err_id, err_tmp, err_path,
                            f"{batch_id}_error.jsonl", n_err, expires_after)
    return out_file, err_file, counts, usage


def _publish(session: Any, tenant: str, file_id: str, tmp: Path, path: Path, filename: str,
             lines: int, expires_after: int | None = None) -> str | None:
    """Move a written output file into place and record it (expiring ``expires_after``
    seconds after now when given: the batch's ``output_expires_after``); drop it when it
    has no line."""
    if not lines:
        tmp.unlink(missing_ok=True)
        return None
    os.replace(tmp, path)
    create_file(session=session, file_id=file_id, tenant=tenant, purpose="batch_output",
                filename=filename, size=path.stat().st_size, path=str(path),
                expires_after=expires_after)
    return file_id


def _job_line(ctx: Context, job: Job) -> str | None:
    if job.status != "succeeded":
        return None
    try:
        body = response_body(job, model_name=ctx.settings.model_name)
    except Exception:  # a stored result that cannot be rendered fails alone
        log.exception("batch job %s: its result cannot be rendered", job.id)
        return None
    if body is None:
        return None
    return format_batch_output_line(
        custom_id=job.custom_id, request_id=job.id, response_body=body, status_code=200, error=None
    )


def _unread_lines(ctx: Context, unread: _Unread) -> Iterator[tuple[int, str | None]]:
    """(line number, custom_id) of each line the expansion never read; none when the
    input file is gone (it cannot be deleted while its batch is open: only by hand)."""
    if unread.path is None or not os.path.exists(unread.path):
        log.warning("input file of a batch with unread lines is gone: %s", unread.path)
        return
    for line_no, raw in unread_lines(unread.path, after=unread.after,
                                     max_bytes=ctx.settings.max_batch_line_bytes):
        yield line_no, line_custom_id(raw, line_number=line_no)


def _unfinished_line(*, custom_id: str | None, request_id: str, final: str) -> str:
    """The error line of a request that never finished: expired or cancelled."""
    if final == "expired":
        return format_error_line(
            custom_id=custom_id,
            request_id=request_id,
            code="batch_expired",
            message="This request could not be executed before the completion window expired.",
            status_code=408,
        )
    return format_error_line(
        custom_id=custom_id,
        request_id=request_id,
        code="batch_cancelled",
        message="This request was cancelled before it finished.",
        status_code=499,
    )


def _failure_line(job: Job, final: str) -> str:
    if job.status in ("queued", "running", "cancelled"):
        return _unfinished_line(custom_id=job.custom_id, request_id=job.id, final=final)
    error = job.error or "generation failed"
    client_side = any(
        w in error.lower()
        for w in ("context", "too long", "invalid", "must", "unknown field", "not allowed")
    )
    return format_error_line(
        custom_id=job.custom_id,
        request_id=job.id,
        message=error,
        code="invalid_request" if client_side else "generation_failed",
        status_code=400 if client_side else 500,
    )
