"""Maintenance thread: heartbeat, keep-alive of held entries, cancellation polling,
stream trimming and the reconciler.

Cancels are polled twice: the Redis signal (fast, every ``cancel_poll_interval``) and the
SQL record (every ``heartbeat_interval``), so a cancel whose signal Redis lost (a restart
without persistence) is still carried out."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import redis
from sqlalchemy.orm import Session, sessionmaker

from worker.queue.cancel import cancelled_among
from worker.queue.consumer import touch
from worker.queue.keys import QueueKeys
from worker.queue.reconciler import reconcile
from worker.queue.trim import trim_streams
from worker.service.config import WorkerConfig
from worker.service.flags import Flags
from worker.service.inflight import Registry
from worker.service.naming import renew_name
from worker.store.crud.jobs import cancel_requested_among
from worker.store.crud.workers import heartbeat

log = logging.getLogger(__name__)


class Maintenance:
    """Periodic chores, each guarded so one failing chore never stops the others."""

    def __init__(
        self,
        *,
        config: WorkerConfig,
        session_factory: sessionmaker[Session],
        redis_client: redis.Redis,
        keys: QueueKeys,
        consumer: str,
        worker_id: str,
        lock_token: str,
        registry: Registry,
        flags: Flags,
        on_cancel: Callable[[set[str]], None],
        status_fn: Callable[[], str],
    ) -> None:
        self.config = config
        self.session_factory = session_factory
        self.redis = redis_client
        self.keys = keys
        self.consumer = consumer
        self.worker_id = worker_id
        self.lock_token = lock_token
        self.registry = registry
        self.flags = flags
        self.on_cancel = on_cancel
        self.status_fn = status_fn
        self.stop = threading.Event()
        self.reconciled = 0
        self._thread = threading.Thread(target=self._run, name="maintenance", daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def close(self) -> None:
        """Stop the thread."""
        self.stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        c = self.config
        now = time.monotonic()
        due = {
            "beat": now,
            "cancel_records": now + c.heartbeat_interval,
            "trim": now + c.trim_interval,
            "reconcile": now + min(c.reconcile_interval, 1.0),
        }
        while not self.stop.wait(c.cancel_poll_interval) and not self.flags.stop_now.is_set():
            self._guard("cancel poll", self._poll_cancels)
            now = time.monotonic()
            if now >= due["beat"]:
                due["beat"] = now + c.heartbeat_interval
                self._guard("heartbeat", self.beat)
            if now >= due["cancel_records"]:
                due["cancel_records"] = now + c.heartbeat_interval
                self._guard("cancel records", self._read_cancel_records)
            if now >= due["trim"]:
                due["trim"] = now + c.trim_interval
                self._guard("trim", lambda: trim_streams(redis_client=self.redis, keys=self.keys))
            if now >= due["reconcile"] and not self.flags.draining.is_set():
                due["reconcile"] = now + c.reconcile_interval
                self._guard("reconcile", self._reconcile)

    def _guard(self, what: str, fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception as exc:
            log.warning("%s failed: %s: %s", what, type(exc).__name__, exc)

    def _poll_cancels(self) -> None:
        ids = self.registry.job_ids()
        if ids:
            found = cancelled_among(redis_client=self.redis, keys=self.keys, job_ids=ids)
            if found:
                self.on_cancel(found)

    def _read_cancel_records(self) -> None:
        ids = self.registry.job_ids()
        if ids:
            with self.session_factory() as session:
                found = cancel_requested_among(session=session, job_ids=ids)
                session.rollback()
            if found:
                self.on_cancel(found)

    def beat(self) -> None:
        """Heartbeat in SQL, keep held entries from looking stale, keep the name lock."""
        entries = self.registry.entries()
        try:
            touch(redis_client=self.redis, keys=self.keys, consumer=self.consumer, entries=entries)
            held = renew_name(redis_client=self.redis, keys=self.keys, name=self.consumer,
                              token=self.lock_token, ttl_s=self.config.lock_ttl)
            if not held and not self.flags.draining.is_set():
                # Two live processes must not share a consumer name: hand the work back.
                log.error("consumer name %r was taken by another process; draining",
                          self.consumer)
                self.flags.request_drain()
        finally:
            with self.session_factory.begin() as session:
                heartbeat(session=session, worker_id=self.worker_id, status=self.status_fn())

    def _reconcile(self) -> None:
        c = self.config
        ids = reconcile(
            session_factory=self.session_factory,
            redis_client=self.redis,
            keys=self.keys,
            grace=timedelta(seconds=c.reconcile_grace),
            worker_timeout=timedelta(seconds=c.worker_timeout),
        )
        self.reconciled += len(ids)
