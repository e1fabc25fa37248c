"""Job ids of batch lines: deterministic per (batch, line), sorting in input order.

Re-running an interrupted expansion therefore cannot create a line's job twice, and the
finalizer gets input order from ``ORDER BY id``."""

from __future__ import annotations


def line_job_id(batch_id: str, line: int) -> str:
    """``job_`` + 20 hex digits of the batch id + the line number in 12 hex digits."""
    return f"job_{batch_id.removeprefix('batch_')[:20]}{line:012x}"


def line_of_job(job_id: str) -> int:
    """The input line number a batch job id encodes."""
    return int(job_id[-12:], 16)
