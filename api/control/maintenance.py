"""Periodic upkeep (Celery beat): reconcile lost jobs, finalize finished batches, expire
batches past their completion window, prune old iteration rows and old jobs' results and
rows, delete expired files."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from api.context import Context
from api.control.finalize import finalize_batch
from worker.jobs.cancel import cancel_batch, cancel_open_of_batch, signal_cancels
from worker.jobs.republish import reconcile
from worker.store.base import utcnow
from worker.store.crud.batch_admin import (
    batches_in_status,
    expired_batch_ids,
    set_batch_status,
    start_expiry,
)
from worker.store.crud.expansion import stalled_expansions
from worker.store.crud.files import delete_file, expired_files, get_file, open_batch_using
from worker.store.crud.retention import (
    delete_old_batches,
    delete_old_jobs,
    expire_job_results,
    prune_iterations,
)
from worker.store.crud.tenant_usage import lock_tenant

log = logging.getLogger(__name__)

EXPIRED_FILES_PER_RUN = 500
"""At most this many expired files are deleted per run of ``delete_expired_files`` (the
next run, a minute later, takes the rest)."""


def reconcile_jobs(ctx: Context) -> int:
    """Re-publish jobs open in SQL but absent from Redis; returns how many."""
    return len(
        reconcile(
            session_factory=ctx.session_factory,
            redis_client=ctx.redis,
            keys=ctx.keys,
            grace=timedelta(seconds=ctx.settings.reconcile_grace),
            worker_timeout=timedelta(seconds=ctx.settings.worker_timeout),
        )
    )


def stalled_expansion_ids(ctx: Context) -> list[str]:
    """Batches with unread lines and no live expansion (never started, or its process
    died and its lease expired): each needs an ``expand_batch`` to resume it."""
    with ctx.session_factory() as session:
        return stalled_expansions(session=session)


def finalize_ready_batches(ctx: Context) -> int:
    """Finalize every in-progress or cancelling batch whose jobs have all ended; one that
    fails is logged (its attempt counted: see ``finalize_max_attempts``) and the others
    go on."""
    with ctx.session_factory() as session:
        ids = batches_in_status(
            session=session, statuses=("in_progress", "cancelling", "finalizing")
        )
    done = 0
    for batch_id in ids:
        try:
            if finalize_batch(ctx, batch_id=batch_id) in ("completed", "cancelled", "expired"):
                done += 1
        except Exception:
            log.exception("batch %s: finalize failed; the next run tries again", batch_id)
    return done


def cancel_batch_jobs(ctx: Context, *, batch_id: str) -> int:
    """Cancel a batch's queued jobs at once and signal its running ones to their workers
    (:func:`worker.jobs.cancel.cancel_batch`); returns how many."""
    return cancel_batch(
        session_factory=ctx.session_factory, redis_client=ctx.redis, keys=ctx.keys, batch_id=batch_id
    )


def expire_batches(ctx: Context) -> list[str]:
    """Expire unfinished batches past their window; returns their ids. In this order:
    out of expansion (``finalizing``, ``expired_at`` set: no chunk commits after it) and
    its open jobs cancelled in the same transaction (none starts in between), then the
    running ones signalled and the files written (unfinished requests, and the lines the
    expansion never read, go to the error file as ``batch_expired``). A finalize that
    cannot run now (locked, or failed) is the 5 s beat's to finish."""
    with ctx.session_factory() as session:
        ids = expired_batch_ids(session=session)
    expired: list[str] = []
    for batch_id in ids:
        with ctx.session_factory.begin() as session:
            if not start_expiry(session=session, batch_id=batch_id):
                continue  # cancelled, finalized or failed since it was listed
            running = cancel_open_of_batch(session=session, batch_id=batch_id)
        expired.append(batch_id)
        try:
            signal_cancels(redis_client=ctx.redis, keys=ctx.keys, job_ids=running)
            finalize_batch(ctx, batch_id=batch_id)
        except Exception:  # it is finalizing: the 5 s finalize run takes it from here
            log.exception("batch %s: expired, its files not written yet", batch_id)
    return expired


def prune_old_iterations(ctx: Context) -> int:
    """Delete iteration rows older than the retention period."""
    cutoff = utcnow() - timedelta(days=ctx.settings.iteration_retention_days)
    with ctx.session_factory.begin() as session:
        return prune_iterations(session=session, older_than=cutoff)


def _cutoff(days: float | None) -> datetime | None:
    """Now less ``days``; None (keep forever) stays None."""
    return None if days is None else utcnow() - timedelta(days=days)


def _in_chunks(ctx: Context, step: Callable[..., int], **kw: object) -> int:
    """Run ``step`` (one chunk of ``ctx.settings.retention_chunk`` jobs) in a transaction
    of its own until a chunk comes back short; returns how many jobs in all."""
    limit, total = ctx.settings.retention_chunk, 0
    while True:
        with ctx.session_factory.begin() as session:
            done = step(session=session, limit=limit, **kw)
        total += done
        if done < limit:
            return total


def expire_old_jobs(ctx: Context) -> dict[str, int]:
    """Job retention: clear the request and result of jobs ended before
    ``job_result_retention_days``, then delete the rows of those ended before
    ``job_retention_days``, then the rows of batches ended before
    ``batch_retention_days`` whose jobs are gone (:mod:`worker.store.crud.retention` says
    which are kept)."""
    results = rows = batches = 0
    result_cutoff = _cutoff(ctx.settings.job_result_retention_days)
    if result_cutoff is not None:
        results = _in_chunks(ctx, expire_job_results, ended_before=result_cutoff, now=utcnow())
    row_cutoff = _cutoff(ctx.settings.job_retention_days)
    if row_cutoff is not None:
        rows = _in_chunks(ctx, delete_old_jobs, ended_before=row_cutoff)
    batch_cutoff = _cutoff(ctx.settings.batch_retention_days)
    if batch_cutoff is not None:
        batches = _in_chunks(ctx, delete_old_batches, ended_before=batch_cutoff)
    return {"results_expired": results, "jobs_deleted": rows, "batches_deleted": batches}


def apply_retention(ctx: Context) -> dict[str, int]:
    """The retention run (hourly: ``retention_interval``): old iteration rows, then old
    jobs' results and rows, then old batches."""
    return {"iterations": prune_old_iterations(ctx), **expire_old_jobs(ctx)}


def delete_expired_files(ctx: Context, *, limit: int = EXPIRED_FILES_PER_RUN) -> list[str]:
    """Delete up to ``limit`` files past their ``expires_at`` and their bytes (freeing the
    tenant's stored-bytes quota); returns their ids. A file that a batch not yet ended
    reads as its input is kept until that batch ends (looked at again under the tenant's
    lock, which batch creation takes too). A file whose bytes cannot be removed is still
    deleted (its bytes logged as an orphan), so no run retries one forever."""
    with ctx.session_factory() as session:
        due = expired_files(session=session, now=utcnow(), limit=limit)
        session.rollback()
    deleted: list[str] = []
    for file_id, tenant in due:
        with ctx.session_factory.begin() as session:
            lock_tenant(session=session, tenant=tenant)
            row = get_file(session=session, file_id=file_id)
            if row is None or open_batch_using(session=session, file_id=file_id) is not None:
                continue
            path = delete_file(session=session, file_id=file_id)
        if path:
            ctx.storage.remove(path)
        deleted.append(file_id)
    return deleted


def mark_cancelling(ctx: Context, *, batch_id: str) -> bool:
    """Move a batch to ``cancelling`` (from validating or in_progress) and cancel its open
    jobs in the same transaction (no job of it starts in between: a queued one ends, a
    running one gets its cancel recorded), then signal the running ones."""
    with ctx.session_factory.begin() as session:
        if not set_batch_status(
            session=session,
            batch_id=batch_id,
            status="cancelling",
            only_from=("validating", "in_progress"),
        ):
            return False
        running = cancel_open_of_batch(session=session, batch_id=batch_id)
    signal_cancels(redis_client=ctx.redis, keys=ctx.keys, job_ids=running)
    return True
