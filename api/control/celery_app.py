"""The Celery app of the control plane, built by a factory.

Broker on Redis. With ``settings.celery_eager`` (the embedded default) every task runs
in-process when it is sent, and :class:`EmbeddedBeat` stands in for ``celery beat``.
For a separate control-plane worker::

    INFLIGHT_CELERY_EAGER=0 celery -A api.control.celery_main worker -B
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from celery import Celery, Task

from api.context import Context
from api.settings import Settings

log = logging.getLogger(__name__)

# task name -> (seconds between runs) for beat
BEAT_SCHEDULE: dict[str, float] = {
    "inflight.finalize_ready_batches": 5.0,
    "inflight.deliver_webhooks": 2.0,
    "inflight.resume_expansions": 5.0,
    "inflight.reconcile_jobs": 30.0,
    "inflight.expire_batches": 60.0,
    "inflight.prune_iterations": 3600.0,
    "inflight.delete_expired_files": 60.0,
    "inflight.refresh_estimates": 30.0,
}


def beat_schedule(settings: Settings) -> dict[str, float]:
    """The beat schedule with the settings' periods (the retention run's is
    ``retention_interval``)."""
    return {**BEAT_SCHEDULE, "inflight.prune_iterations": settings.retention_interval}


def make_celery(settings: Settings, get_ctx: Callable[[], Context]) -> Celery:
    """A Celery app whose tasks run against the Context ``get_ctx()`` returns."""
    app = Celery("inflight", broker=settings.celery_broker)
    app.conf.update(
        task_always_eager=settings.celery_eager,
        task_eager_propagates=False,
        task_ignore_result=True,
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        task_default_queue=f"{settings.prefix}:control",
        broker_connection_retry_on_startup=True,
        beat_schedule={
            name: {"task": name, "schedule": every}
            for name, every in beat_schedule(settings).items()
        },
    )
    _register(app, get_ctx)
    return app


def _register(app: Celery, get_ctx: Callable[[], Context]) -> None:
    from api.control import estimate, expand, finalize, maintenance, webhooks

    # acks_late + reject_on_worker_lost: a Celery child killed mid-expansion puts the task
    # back on the broker; any exception retries with backoff. Both resume after the last
    # committed chunk (and resume_expansions catches whatever still slips through).
    # A redelivered task that finds the dead child's lease still running retries once the
    # lease can have expired (eager mode leaves that to the beat's resume_expansions).
    @app.task(
        name="inflight.expand_batch",
        shared=False,
        bind=True,
        acks_late=True,
        reject_on_worker_lost=True,
        autoretry_for=(Exception,),
        retry_backoff=True,
        retry_backoff_max=60,
        max_retries=8,
    )
    def expand_batch(self: Task, batch_id: str) -> str:
        ctx = get_ctx()
        status = expand.expand_batch(ctx, batch_id=batch_id)
        if status == "busy" and not app.conf.task_always_eager:
            raise self.retry(countdown=ctx.settings.expand_lease, max_retries=None)
        if status == "in_progress":
            finalize.finalize_batch(ctx, batch_id=batch_id)
        return status

    @app.task(name="inflight.resume_expansions", shared=False)
    def resume_expansions() -> list[str]:
        ids = maintenance.stalled_expansion_ids(get_ctx())
        for batch_id in ids:
            send(app, "inflight.expand_batch", batch_id)
        return ids

    @app.task(name="inflight.finalize_batch", shared=False)
    def finalize_batch(batch_id: str) -> str:
        return finalize.finalize_batch(get_ctx(), batch_id=batch_id)

    @app.task(name="inflight.cancel_batch", shared=False)
    def cancel_batch(batch_id: str) -> str:
        ctx = get_ctx()
        maintenance.cancel_batch_jobs(ctx, batch_id=batch_id)
        return finalize.finalize_batch(ctx, batch_id=batch_id)

    @app.task(name="inflight.finalize_ready_batches", shared=False)
    def finalize_ready_batches() -> int:
        return maintenance.finalize_ready_batches(get_ctx())

    @app.task(name="inflight.deliver_webhooks", shared=False)
    def deliver_webhooks() -> dict[str, int]:
        return webhooks.deliver_due_webhooks(get_ctx())

    @app.task(name="inflight.reconcile_jobs", shared=False)
    def reconcile_jobs() -> int:
        return maintenance.reconcile_jobs(get_ctx())

    @app.task(name="inflight.expire_batches", shared=False)
    def expire_batches() -> list[str]:
        return maintenance.expire_batches(get_ctx())

    @app.task(name="inflight.prune_iterations", shared=False)
    def prune_iterations() -> dict[str, int]:
        """Retention: iteration rows, then finished jobs' results and rows."""
        return maintenance.apply_retention(get_ctx())

    @app.task(name="inflight.refresh_estimates", shared=False)
    def refresh_estimates() -> int:
        """Each open batch's estimated_completion_at, at the throughput of now."""
        return estimate.refresh_estimates(get_ctx())

    # no retries: a failed run leaves its files for the next beat, a minute later
    @app.task(name="inflight.delete_expired_files", shared=False)
    def delete_expired_files() -> list[str]:
        return maintenance.delete_expired_files(get_ctx())


def send(app: Celery, name: str, *args: Any) -> None:
    """Send a task by name (runs at once, in this thread, in eager mode)."""
    task = app.tasks[name]
    if app.conf.task_always_eager:
        result = task.apply(args=args)
        if result.failed():
            log.error("task %s%r failed: %s", name, args, result.result)
    else:
        task.delay(*args)


class Dispatcher:
    """Sends control-plane tasks without making the caller wait: to the broker, or in eager
    mode to a small thread pool of this process (so ``POST /v1/batches`` answers at once)."""

    def __init__(self, app: Celery, *, threads: int = 2) -> None:
        self.app = app
        self._pool: ThreadPoolExecutor | None = None
        self._pending: set[Future[None]] = set()
        if app.conf.task_always_eager:
            self._pool = ThreadPoolExecutor(threads, thread_name_prefix="inflight-control")

    def submit(self, name: str, *args: Any) -> None:
        """Run task ``name`` in the background."""
        if self._pool is None:
            send(self.app, name, *args)
        else:
            future = self._pool.submit(send, self.app, name, *args)
            self._pending.add(future)
            future.add_done_callback(self._pending.discard)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every submitted task ended (eager mode); whether they all did."""
        _, not_done = wait(list(self._pending), timeout=timeout)
        return not not_done

    def close(self) -> None:
        """Wait for running tasks; drop queued ones (the beat resumes what they would do)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


class EmbeddedBeat:
    """In eager mode: a daemon thread running the beat schedule in-process, every
    ``interval`` seconds at most (the schedule's own periods are respected)."""

    def __init__(self, app: Celery, *, interval: float,
                 schedule: dict[str, float] | None = None) -> None:
        self.app = app
        self.interval = interval
        self.schedule = BEAT_SCHEDULE if schedule is None else schedule
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next: dict[str, float] = {}

    def start(self) -> None:
        """Start ticking."""
        if self.interval <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="inflight-beat", daemon=True)
        self._thread.start()

    def tick(self, now: float) -> None:
        """Run every task that is due at ``now`` (monotonic seconds)."""
        for name, every in self.schedule.items():
            if now >= self._next.get(name, 0.0):
                self._next[name] = now + (self.interval if every < 10 else every)
                try:
                    send(self.app, name)
                except Exception:
                    log.exception("beat task %s failed", name)

    def _run(self) -> None:
        import time

        while not self._stop.wait(self.interval):
            self.tick(time.monotonic())

    def stop(self) -> None:
        """Stop ticking and wait for the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
