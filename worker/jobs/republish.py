"""Re-publishing: open jobs that SQL holds but no stream entry carries are published again,
each to the streams of its model (``jobs.model``), a batch job to the lane of its deadline
(``jobs.deadline``).

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
from datetime import datetime, timedelta

import redis
from sqlalchemy.orm import Session, sessionmaker

from worker.queue.carried import carried_among, ensure_index
from worker.queue.group import ensure_groups
from worker.queue.keys import QueueKeys
from worker.queue.lock import RenewableLock
from worker.queue.message import JobMessage
from worker.queue.producer import publish
from worker.queue.slack import DEFAULT_WINDOW_S
from worker.store.base import utcnow
from worker.store.crud.job_status import assign_model
from worker.store.crud.jobs import open_job_heads, open_jobs_with_ids
from worker.store.crud.workers import live_worker_ids
from worker.store.models import Job

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
    """Re-publish open jobs (queued before now - ``grace``) absent from their model's
    streams and not held by a live worker, each to its model's streams. A job without a
    model (a row from before revision 0014 no worker had run) is given ``keys.model`` (a
    worker's own model, the API's default model) and left alone where that names none.
    Returns the re-published job ids ([] if another reconciler holds the lock)."""
    token = uuid.uuid4().hex
    lock = RenewableLock(redis_client, keys.reconcile_lock, token, lock_ttl_s)
    if not lock.take():
        return []
    try:
        by_model = _candidates(session_factory, keys, lock, utcnow() - grace, worker_timeout)
        out: list[str] = []
        for model, job_ids in sorted(by_model.items()):
            lock.renew()
            out += _republish_absent(session_factory, redis_client, keys.for_model(model), job_ids)
        return out
    finally:
        lock.release()


def _candidates(
    session_factory: sessionmaker[Session],
    keys: QueueKeys,
    lock: RenewableLock,
    cutoff: datetime,
    worker_timeout: timedelta,
) -> dict[str, list[str]]:
    """The open jobs queued before ``cutoff`` that no live worker runs, by model."""
    by_model: dict[str, list[str]] = {}
    unassigned: list[str] = []
    with session_factory() as session:
        live = live_worker_ids(session=session, within=worker_timeout)
        after = ""
        while True:
            heads = open_job_heads(session=session, queued_before=cutoff, after_id=after)
            for h in heads:
                if h.status == "running" and h.worker_id in live:
                    continue
                if h.model:
                    by_model.setdefault(h.model, []).append(h.id)
                else:
                    unassigned.append(h.id)
            if len(heads) < 10_000:
                break
            after = heads[-1].id
            lock.renew()
    if unassigned and keys.model:
        with session_factory.begin() as session:
            adopted = assign_model(session=session, job_ids=unassigned, model=keys.model)
        log.warning("%d open jobs without a model were given model %r", len(adopted), keys.model)
        by_model.setdefault(keys.model, []).extend(adopted)
    return by_model


def _deadline(job: Job) -> float | None:
    """The epoch deadline a re-published batch job goes to the lane of: its own, else (a row
    from before revision 0016) ``DEFAULT_WINDOW_S`` after it was queued."""
    if job.queue_class != "batch":
        return None
    due = job.deadline or job.queued_at + timedelta(seconds=DEFAULT_WINDOW_S)
    return due.timestamp()


def _republish_absent(
    session_factory: sessionmaker[Session],
    redis_client: redis.Redis,
    keys: QueueKeys,
    candidates: list[str],
) -> list[str]:
    """Publish those of ``candidates`` (jobs of ``keys.model``) its carried index does not
    name (built from the model's streams first, where it is not ready)."""
    ensure_groups(redis_client=redis_client, keys=keys)
    rebuilt = ensure_index(redis_client=redis_client, keys=keys)
    if rebuilt:
        log.info("carried-jobs index of %r built from the streams: %d entries", keys.model, rebuilt)
    present = carried_among(redis_client=redis_client, keys=keys, job_ids=candidates)
    absent = [j for j in candidates if j not in present]
    if not absent:
        return []
    with session_factory() as session:  # bodies of the absent only; drop those ended
        missing = open_jobs_with_ids(session=session, job_ids=absent)
    msgs = [
        (
            j.queue_class,
            JobMessage(
                job_id=j.id, body=j.request, tenant=j.tenant, priority=j.priority,
                attempt=j.attempts, deadline=_deadline(j),
            ),
        )
        for j in missing
    ]
    publish(redis_client=redis_client, keys=keys, messages=msgs)
    log.warning("reconciler re-published %d jobs of %r absent from Redis", len(msgs), keys.model)
    return [j.id for j in missing]
