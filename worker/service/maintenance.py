"""Maintenance: three threads, so that a slow or unreachable PostgreSQL never stops the
keep-alive of the entries this worker holds (other workers would take them over and run
them a second time).

- keep-alive (Redis only): touch held entries and renew the consumer-name lock every
  ``heartbeat_interval``, poll the cancel signals, trim the streams;
- upkeep (SQL): the worker heartbeat row and the recorded cancels;
- reconciler: its own thread, so a long reconcile never delays the heartbeat (a worker
  whose heartbeat lapses looks dead, and its running jobs would be re-published); before
  each reconcile it moves what an older deployment's untagged keys still hold
  (``worker.jobs.legacy_keys``).

Cancels are read twice: the Redis signal (fast, every ``cancel_poll_interval``) and the SQL
record (every ``heartbeat_interval``), so a cancel whose signal Redis lost (a restart
without persistence) is still carried out."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

from worker.jobs.legacy_keys import LegacyMove, move_legacy_keys
from worker.jobs.republish import reconcile
from worker.queue.cancel import cancelled_among
from worker.queue.consumer import touch
from worker.queue.legacy import mover_name
from worker.queue.trim import trim_streams
from worker.service.naming import renew_name
from worker.service.runtime import WorkerRuntime
from worker.store.crud.jobs import cancel_requested_among
from worker.store.crud.workers import heartbeat
from worker.store.models import WorkerStatus

log = logging.getLogger(__name__)


class Maintenance:
    """Periodic chores on three threads, each chore guarded so one failing never stops
    the others."""

    def __init__(self, *, runtime: WorkerRuntime, on_cancel: Callable[[set[str]], None]) -> None:
        self.rt, self.on_cancel = runtime, on_cancel
        self.stop = threading.Event()
        self.reconciled = 0
        self._threads = [
            threading.Thread(target=self._run_keepalive, name="keepalive", daemon=True),
            threading.Thread(target=self._run_upkeep, name="upkeep", daemon=True),
            threading.Thread(target=self._run_reconciler, name="reconciler", daemon=True),
        ]

    def _status(self) -> str:
        """What the heartbeat reports: draining once a drain was asked, else running."""
        draining = self.rt.flags.draining.is_set()
        return WorkerStatus.DRAINING.value if draining else WorkerStatus.RUNNING.value

    def start(self) -> None:
        """Start the threads."""
        for t in self._threads:
            t.start()

    def close(self) -> None:
        """Stop the threads."""
        self.stop.set()
        for t in self._threads:
            t.join(5)

    def _ticks(self, interval: float) -> Iterator[float]:
        while not self.stop.wait(interval) and not self.rt.flags.stop_now.is_set():
            yield time.monotonic()

    def _run_keepalive(self) -> None:
        c = self.rt.config
        now = time.monotonic()
        due = {"touch": now, "trim": now + c.trim_interval}
        for now in self._ticks(c.cancel_poll_interval):
            self._guard("cancel poll", self._poll_cancels)
            if now >= due["touch"]:
                due["touch"] = now + c.heartbeat_interval
                self._guard("keep-alive", self.keep_alive)
            if now >= due["trim"]:
                due["trim"] = now + c.trim_interval
                self._guard("trim", self._trim)

    def _run_upkeep(self) -> None:
        self._guard("heartbeat", self.heartbeat)
        for _ in self._ticks(self.rt.config.heartbeat_interval):
            self._guard("heartbeat", self.heartbeat)
            self._guard("cancel records", self._read_cancel_records)

    def _run_reconciler(self) -> None:
        c = self.rt.config
        due = time.monotonic() + min(c.reconcile_interval, 1.0)
        for now in self._ticks(min(c.reconcile_interval, 1.0)):
            if now >= due and not self.rt.flags.draining.is_set():
                due = now + c.reconcile_interval
                self._guard("reconcile", self._reconcile)

    def _guard(self, what: str, fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception as exc:
            log.warning("%s failed: %s: %s", what, type(exc).__name__, exc)

    def _poll_cancels(self) -> None:
        ids = self.rt.registry.job_ids()
        if ids:
            found = cancelled_among(redis_client=self.rt.redis, keys=self.rt.keys, job_ids=ids)
            if found:
                self.on_cancel(found)

    def _read_cancel_records(self) -> None:
        ids = self.rt.registry.job_ids()
        if ids:
            with self.rt.session_factory() as session:
                found = cancel_requested_among(session=session, job_ids=ids)
                session.rollback()
            if found:
                self.on_cancel(found)

    def keep_alive(self) -> None:
        """Keep held entries from looking stale and keep the consumer-name lock (Redis)."""
        touch(
            redis_client=self.rt.redis,
            keys=self.rt.keys,
            consumer=self.rt.consumer,
            entries=self.rt.registry.entries(),
        )
        held = renew_name(redis_client=self.rt.redis, keys=self.rt.keys, name=self.rt.consumer,
                          token=self.rt.lock_token, ttl_s=self.rt.config.lock_ttl)
        if not held and not self.rt.flags.draining.is_set():
            # Two live processes must not share a consumer name: hand the work back.
            log.error("consumer name %r was taken by another process; draining", self.rt.consumer)
            self.rt.flags.request_drain()

    def _trim(self) -> None:
        trim_streams(redis_client=self.rt.redis, keys=self.rt.keys)

    def heartbeat(self) -> None:
        """The worker's heartbeat row in SQL."""
        with self.rt.session_factory.begin() as session:
            heartbeat(session=session, worker_id=self.rt.worker_id, status=self._status())

    def _reconcile(self) -> None:
        c = self.rt.config
        move_old_keys(self.rt)
        ids = reconcile(
            session_factory=self.rt.session_factory,
            redis_client=self.rt.redis,
            keys=self.rt.keys,
            grace=timedelta(seconds=c.reconcile_grace),
            worker_timeout=timedelta(seconds=c.worker_timeout),
        )
        self.reconciled += len(ids)


def move_old_keys(rt: WorkerRuntime) -> LegacyMove:
    """Move what the untagged keys of an older deployment still hold to this worker's
    model's keys (``worker.jobs.legacy_keys``; nothing to do is one EXISTS)."""
    return move_legacy_keys(
        session_factory=rt.session_factory, redis_client=rt.redis, keys=rt.keys,
        mover=mover_name(rt.consumer), min_idle_ms=rt.config.claim_idle_ms,
    )
