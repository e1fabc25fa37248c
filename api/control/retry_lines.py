"""The input of a retry (``POST /v1/batches/{id}/retry``): exactly the lines of a finished
batch that have a line in its error file, in input order, each with its own custom_id.

A line that became a job and did not succeed (failed at the worker, cancelled, expired) is
rebuilt from the job row: its stored request (the body that ran) under its custom_id, as an
OpenAI Batch input line. A line that never became a job (invalid at expansion: bad JSON,
unknown field, over a limit) is copied byte for byte from the batch's input file, where its
job id's line number says it is; such lines need that file still stored. So are the lines
past what the expansion read when the batch expired or was cancelled before it read them
all (the finalizer wrote them to the error file as ``batch_expired`` / ``batch_cancelled``)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import BinaryIO

from api.context import Context
from api.control.batch_ids import line_of_job
from api.control.input_lines import unread_lines
from api.errors import ApiError
from worker.protocol.openai_batch import split_stored
from worker.store.crud.batch_admin import batch_jobs_in_order, get_progress, job_count
from worker.store.crud.files import get_file
from worker.store.models import Batch, Job

_BLOCK = 1 << 20


def job_line(job: Job) -> bytes:
    """A failed job's OpenAI Batch input line: its custom_id and the request it ran. 409
    ``request_expired`` once retention cleared that request."""
    if job.result_expired_at is not None:
        raise ApiError(
            409,
            f"the request of job {job.id!r} (custom_id {job.custom_id!r}) was cleared by "
            "retention, so its batch cannot be retried",
            code="request_expired",
            param="batch_id",
        )
    url, body = split_stored(job.request)
    line = {"custom_id": job.custom_id, "method": "POST", "url": url, "body": body}
    return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def write_retry_file(ctx: Context, batch: Batch, tmp: Path) -> tuple[int, int]:
    """Write the retry input of ``batch`` (finished) to ``tmp``; returns (lines, bytes).
    400 ``input_file_missing`` when invalid lines must be copied from an input file that
    was deleted meanwhile."""
    max_bytes = ctx.settings.max_batch_line_bytes
    with ctx.session_factory() as session:
        progress = get_progress(session=session, batch_id=batch.id)
        lines_read, invalid = progress.lines_read or 0, progress.invalid_lines or 0
        f = get_file(session=session, file_id=batch.input_file_id or "", tenant=batch.tenant)
        input_path = f.path if f is not None else None
        # an expiry or cancel that came before the expansion ended: the unread lines too
        tail = not progress.expanded and batch.status in ("expired", "cancelled")
        unread = 0
        if tail and input_path is not None and Path(input_path).exists():
            unread = sum(1 for _ in unread_lines(input_path, after=lines_read,
                                                 max_bytes=max_bytes))
        jobs_made = (batch.request_total or 0) - invalid - unread
        if job_count(session=session, batch_id=batch.id) < jobs_made:
            raise ApiError(
                409,
                f"jobs of batch {batch.id!r} were deleted by retention "
                "(INFLIGHT_JOB_RETENTION_DAYS), so its failed lines cannot be rebuilt",
                code="jobs_expired",
                param="batch_id",
            )
    missing = ApiError(
        400,
        f"{invalid} lines of batch {batch.id!r} were invalid and its input file "
        f"{batch.input_file_id!r} is deleted, so they cannot be rebuilt",
        code="input_file_missing",
        param="batch_id",
    )
    if (invalid or tail) and input_path is None:
        raise missing
    count = 0
    with open(tmp, "wb") as out, contextlib.ExitStack() as stack:
        src: BinaryIO | None = None
        if (invalid or tail) and input_path is not None:
            try:
                src = stack.enter_context(open(input_path, "rb"))
            except FileNotFoundError:
                raise missing from None
        at = 0  # the input lines up to here are handled

        def invalid_lines_before(line: int) -> None:
            """Copy the lines after ``at`` and before ``line`` (none became a job: each is
            blank or invalid) from the input file."""
            nonlocal at, count
            while at + 1 < line:
                at += 1
                if src is not None and _copy_line(src, out, max_bytes):
                    count += 1

        after = ""
        while True:
            with ctx.session_factory() as session:
                jobs = batch_jobs_in_order(session=session, batch_id=batch.id, after_id=after)
            if not jobs:
                break
            after = jobs[-1].id
            for job in jobs:
                n = line_of_job(job.id)
                invalid_lines_before(n)
                at = n
                if src is not None:
                    _skip_line(src)
                if job.status != "succeeded":
                    out.write(job_line(job))
                    count += 1
        invalid_lines_before(lines_read + 1)
        while tail and src is not None and (copied := _copy_line(src, out, max_bytes)) is not None:
            count += copied
        size = out.tell()
    return count, size


def _skip_line(src: BinaryIO) -> None:
    while True:
        part = src.readline(_BLOCK)
        if not part or part.endswith(b"\n"):
            return


def _copy_line(src: BinaryIO, out: BinaryIO, max_bytes: int) -> bool | None:
    """Copy one input line in blocks (a last line without a newline gets one); whether it
    was a request line (a blank line, which the expansion skips, is not copied; one longer
    than ``max_bytes`` was that line's ``line_too_long`` error, and is); None at the end
    of the file."""
    part = src.readline(_BLOCK)
    if not part:
        return None
    whole = part.endswith(b"\n") or len(part) < _BLOCK  # the line fits in one block
    if whole and len(part) <= max_bytes and not part.strip():
        return False
    while part:
        out.write(part)
        if part.endswith(b"\n"):
            return True
        part = src.readline(_BLOCK)
    out.write(b"\n")
    return True
