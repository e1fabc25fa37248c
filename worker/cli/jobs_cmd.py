"""``inflight jobs [--status S]`` lists jobs; ``inflight job ID`` shows one with its result."""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import Any

COLUMNS = (
    "id", "tenant", "batch_id", "custom_id", "queue_class", "status", "priority", "request",
    "text", "finish_reason", "prompt_tokens", "completion_tokens", "error", "queued_at",
    "started_at", "first_token_at", "finished_at", "attempts", "worker_id", "first_step",
    "last_step", "isolation", "choices",
)  # fmt: skip


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
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--database-url", default=None, help="overrides DATABASE_URL")
    p.set_defaults(func=run)


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


def run(args: argparse.Namespace) -> int:
    """Print the jobs (a table, or JSON lines with --json) and a count per status."""
    from worker.store.crud.jobs import count_by_status, list_jobs

    db, sf = _session_factory(args.database_url)
    try:
        with sf() as s:
            jobs = list_jobs(
                session=s,
                status=args.status,
                tenant=args.tenant,
                batch_id=args.batch_id,
                limit=args.limit,
            )
            counts = count_by_status(session=s, batch_id=args.batch_id, tenant=args.tenant)
    finally:
        db.dispose()
    if args.json:
        for job in jobs:
            print(json.dumps(job_dict(job)))
        return 0
    print(f"{'ID':38} {'STATUS':10} {'TOKENS':>7} {'CUSTOM_ID':20} ERROR/FINISH")
    for job in jobs:
        tokens = "" if job.completion_tokens is None else str(job.completion_tokens)
        tail = job.error or job.finish_reason or ""
        print(
            f"{job.id:38} {job.status:10} {tokens:>7} {(job.custom_id or '')[:20]:20} {tail[:60]}"
        )
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
