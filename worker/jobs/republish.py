"""Re-publishing: open jobs that SQL holds but no stream entry carries are published again.

That happens when Redis restarted without persistence (or was flushed), or when a
producer's publish failed after its commit (:class:`worker.jobs.enqueue.NotPublished`).
Jobs that a live worker is running are left alone: that worker still writes their results.

Incremental: SQL gives the open jobs' ids (no request bodies), Redis the carried ones by
id (``worker.queue.carried``: no stream is read, except once to build that index after
Redis lost its data); only the bodies of the missing jobs are loaded and published.
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta

import redis
from sqlalchemy.orm import Session, sessionmaker

from worker.queue.carried import carried_among, ensure_index
from worker.queue.group import ensure_groups
from worker.queue.keys import QueueKeys
from worker.queue.lock import RenewableLock
from worker.queue.message import JobMessage
from worker.queue.producer import publish
from worker.store.base import utcnow
from worker.store.crud.jobs import open_job_heads, open_jobs_with_ids
from worker.store.crud.workers import live_worker_ids

log = logging.getLogger(__name__)


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
    lock = RenewableLock(redis_client, keys.reconcile_lock, token, lock_ttl_s)
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
        rebuilt = ensure_index(redis_client=redis_client, keys=keys)
        if rebuilt:
            log.info("carried-jobs index built from the streams: %d entries", rebuilt)
        present = carried_among(redis_client=redis_client, keys=keys, job_ids=candidates)
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
