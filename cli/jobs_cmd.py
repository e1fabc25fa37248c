"""``inflight jobs [--status S]`` lists jobs; ``inflight job ID`` shows one with its result.

The listing reads the store a page at a time with a keyset cursor (the last id printed), so
``--limit 0`` (every matching row) prints as it reads and its memory stays flat at any size.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from datetime import datetime
from typing import Any

COLUMNS = (
    "id", "tenant", "batch_id", "custom_id", "queue_class", "status", "priority", "request",
    "text", "finish_reason", "prompt_tokens", "completion_tokens", "error", "queued_at",
    "started_at", "first_token_at", "finished_at", "attempts", "worker_id", "first_step",
    "last_step", "isolation", "choices",
)  # fmt: skip

PAGE = 1000  # rows per query while listing


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``jobs`` and ``job`` (each only if not registered yet)."""
    if "jobs" not in subparsers.choices:
        _add_jobs(subparsers)
    if "job" not in subparsers.choices:
        _add_job(subparsers)


def _add_jobs(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("jobs", help="list jobs and their state")
    p.add_argument("--status", choices=("queued", "running", "succeeded", "failed", "cancelled"))
    p.add_argument("--tenant", default=None)
    p.add_argument("--batch-id", default=None)
    p.add_argument("--after", default=None, metavar="ID",
                   help="start after this job (e.g. the last id a previous listing printed)")
    p.add_argument("--limit", type=_row_limit, default=100,
                   help=f"rows to print (default 100); 0: every matching row, read {PAGE} "
                        "at a time")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--database-url", default=None, help="overrides DATABASE_URL")
    p.set_defaults(func=run)


def _row_limit(text: str) -> int:
    """``--limit``: a whole number, 0 (all rows) or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 (every row) or more")
    return value


def _add_job(subparsers: argparse._SubParsersAction) -> None:
    q = subparsers.add_parser("job", help="show one job, its timeline and its result")
    q.add_argument("job_id")
    q.add_argument("--database-url", default=None, help="overrides DATABASE_URL")
    q.set_defaults(func=run_one)


def job_dict(job: Any) -> dict[str, Any]:
    """A JSON-ready dict of a Job row."""
    out = {}
    for name in COLUMNS:
        value = getattr(job, name)
        out[name] = value.isoformat() if isinstance(value, datetime) else value
    return out


def _session_factory(url_flag: str | None):
    from worker.store.db import database_url, make_engine, make_session_factory

    db = make_engine(url=database_url(url_flag))
    return db, make_session_factory(engine=db)


def iter_jobs(sf: Any, args: argparse.Namespace) -> Iterator[Any]:
    """The jobs ``args`` select, in queue order after ``args.after``, at most ``args.limit``
    (0: all): ``PAGE`` rows per query, each page in its own short session, the next one
    starting after the last id of the one before."""
    from worker.store.crud.jobs import list_jobs

    after, left = args.after, args.limit or None
    while left is None or left > 0:
        size = PAGE if left is None else min(PAGE, left)
        with sf() as s:
            page = list_jobs(session=s, status=args.status, tenant=args.tenant,
                             batch_id=args.batch_id, limit=size, after=after)
        yield from page
        if len(page) < size:
            return
        after = page[-1].id
        left = None if left is None else left - len(page)


def _table_line(job: Any) -> str:
    """One job as a row of the text table."""
    tokens = "" if job.completion_tokens is None else str(job.completion_tokens)
    tail = job.error or job.finish_reason or ""
    return f"{job.id:38} {job.status:10} {tokens:>7} {(job.custom_id or '')[:20]:20} {tail[:60]}"


def _cursor_known(sf: Any, job_id: str | None) -> bool:
    """Whether ``--after`` names a stored job (an unknown one would list nothing)."""
    from worker.store.crud.jobs import get_job

    if job_id is None:
        return True
    with sf() as s:
        return get_job(session=s, job_id=job_id) is not None


def run(args: argparse.Namespace) -> int:
    """Print the jobs as they are read (a table, or JSON lines with --json), then, for the
    table, a count per status; 1 if ``--after`` names no job."""
    from worker.store.crud.jobs import count_by_status

    db, sf = _session_factory(args.database_url)
    try:
        if not _cursor_known(sf, args.after):
            print(f"no job {args.after!r} (--after)", file=sys.stderr)
            return 1
        if args.json:
            for job in iter_jobs(sf, args):
                print(json.dumps(job_dict(job)))
            return 0
        print(f"{'ID':38} {'STATUS':10} {'TOKENS':>7} {'CUSTOM_ID':20} ERROR/FINISH")
        for job in iter_jobs(sf, args):
            print(_table_line(job))
        with sf() as s:
            counts = count_by_status(session=s, batch_id=args.batch_id, tenant=args.tenant)
    finally:
        db.dispose()
    print("  ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "no jobs")
    return 0


def run_one(args: argparse.Namespace) -> int:
    """Print one job as JSON; 1 if there is no such job."""
    from worker.store.crud.jobs import get_job

    db, sf = _session_factory(args.database_url)
    try:
        with sf() as s:
            job = get_job(session=s, job_id=args.job_id)
            data = job_dict(job) if job else None
    finally:
        db.dispose()
    if data is None:
        print(f"no job {args.job_id!r}")
        return 1
    print(json.dumps(data, indent=2))
    return 0
