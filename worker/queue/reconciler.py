"""Reconciler: re-publish jobs that SQL says are open but that no stream entry carries.

That happens when Redis restarted without persistence (or was flushed), or when a
producer crashed between its commit and its XADD. Jobs that a live worker is running
are left alone: that worker still writes their results.
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta
from typing import Any, cast

import redis
from sqlalchemy.orm import Session, sessionmaker

from worker.queue.group import ensure_groups
from worker.queue.keys import QueueKeys
from worker.queue.message import JobMessage
from worker.queue.producer import publish
from worker.store.base import utcnow
from worker.store.crud.jobs import open_jobs, statuses
from worker.store.crud.workers import live_worker_ids

log = logging.getLogger(__name__)


def job_ids_in_streams(*, redis_client: redis.Redis, keys: QueueKeys, page: int = 2000) -> set[str]:
    """Job ids carried by any entry still in a job stream (pending or not yet read)."""
    present: set[str] = set()
    for stream in keys.streams:
        start = "-"
        while True:
            entries = cast(Any, redis_client).xrange(stream, min=start, max="+", count=page)
            for _entry_id, fields in entries:
                if fields and "job_id" in fields:
                    present.add(fields["job_id"])
            if len(entries) < page:
                break
            start = "(" + entries[-1][0]
    return present


def reconcile(
    *,
    session_factory: sessionmaker[Session],
    redis_client: redis.Redis,
    keys: QueueKeys,
    grace: timedelta = timedelta(seconds=30),
    worker_timeout: timedelta = timedelta(seconds=60),
    lock_ttl_s: int = 60,
) -> list[str]:
    """Re-publish open jobs (queued before now - ``grace``) absent from every stream and
    not held by a live worker. Returns the re-published job ids ([] if another reconciler
    holds the lock)."""
    token = uuid.uuid4().hex
    if not cast(Any, redis_client).set(keys.reconcile_lock, token, nx=True, ex=lock_ttl_s):
        return []
    try:
        ensure_groups(redis_client=redis_client, keys=keys)
        cutoff = utcnow() - grace
        with session_factory() as session:
            live = live_worker_ids(session=session, within=worker_timeout)
            candidates = []
            after = ""
            while True:
                rows = open_jobs(session=session, queued_before=cutoff, after_id=after)
                candidates += [
                    j for j in rows if not (j.status == "running" and j.worker_id in live)
                ]
                if len(rows) < 10_000:
                    break
                after = rows[-1].id
        if not candidates:
            return []
        present = job_ids_in_streams(redis_client=redis_client, keys=keys)
        missing = [j for j in candidates if j.id not in present]
        if not missing:
            return []
        with session_factory() as session:  # drop those that ended meanwhile
            now_status = statuses(session=session, job_ids=[j.id for j in missing])
        missing = [j for j in missing if now_status.get(j.id) in ("queued", "running")]
        msgs = [
            (
                j.queue_class,
                JobMessage(
                    job_id=j.id,
                    body=j.request,
                    tenant=j.tenant,
                    priority=j.priority,
                    attempt=j.attempts,
                ),
            )
            for j in missing
        ]
        publish(redis_client=redis_client, keys=keys, messages=msgs)
        log.warning("reconciler re-published %d jobs absent from Redis", len(msgs))
        return [j.id for j in missing]
    finally:
        if cast(Any, redis_client).get(keys.reconcile_lock) == token:
            cast(Any, redis_client).delete(keys.reconcile_lock)
