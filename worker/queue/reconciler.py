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
from worker.store.crud.jobs import open_job_heads, open_jobs_with_ids
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
    lock = _Lock(redis_client, keys.reconcile_lock, token, lock_ttl_s)
    if not lock.take():
        return []
    try:
        ensure_groups(redis_client=redis_client, keys=keys)
        cutoff = utcnow() - grace
        candidates: list[str] = []
        with session_factory() as session:
            live = live_worker_ids(session=session, within=worker_timeout)
            after = ""
            while True:
                heads = open_job_heads(session=session, queued_before=cutoff, after_id=after)
                candidates += [
                    job_id
                    for job_id, status, worker in heads
                    if not (status == "running" and worker in live)
                ]
                if len(heads) < 10_000:
                    break
                after = heads[-1][0]
                lock.renew()
        if not candidates:
            return []
        lock.renew()
        present = job_ids_in_streams(redis_client=redis_client, keys=keys)
        absent = [j for j in candidates if j not in present]
        if not absent:
            return []
        lock.renew()
        with session_factory() as session:  # bodies of the absent only; drop those ended
            missing = open_jobs_with_ids(session=session, job_ids=absent)
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
        lock.release()


# Extend or delete the lock only while it is still ours.
_RENEW = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then "
    "return redis.call('EXPIRE', KEYS[1], ARGV[2]) end return 0"
)
_RELEASE = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)


class _Lock:
    """The reconciler's Redis lock, renewed at each stage so that it is held for as long as
    the run lasts (two reconcilers never publish the same missing job twice)."""

    def __init__(self, client: redis.Redis, key: str, token: str, ttl_s: int) -> None:
        self.client, self.key, self.token, self.ttl_s = cast(Any, client), key, token, ttl_s

    def take(self) -> bool:
        """Take the lock; False when another reconciler holds it."""
        return bool(self.client.set(self.key, self.token, nx=True, ex=self.ttl_s))

    def renew(self) -> None:
        """Extend the lock; raises when it expired and was taken by another."""
        if not self.client.eval(_RENEW, 1, self.key, self.token, self.ttl_s):
            raise RuntimeError("the reconciler lock was lost; another reconciler runs")

    def release(self) -> None:
        """Delete the lock if it is still ours."""
        self.client.eval(_RELEASE, 1, self.key, self.token)
