"""The delta publisher thread: the engine loop hands it the text deltas of streamed jobs
after each step; it writes them to the jobs' event streams (one pipeline for whatever
accumulated), so a slow or unreachable Redis never holds up the engine. Deltas that cannot
be written are dropped (logged): the streaming reader completes the text from SQL."""

from __future__ import annotations

import logging
import queue
import threading

import redis

from worker.queue.job_events import Delta, publish_events
from worker.service.runtime import WorkerRuntime

log = logging.getLogger(__name__)


class DeltaPublisher:
    """Started on first use; ``close`` writes what is queued, then stops."""

    def __init__(self, *, runtime: WorkerRuntime) -> None:
        self.rt = runtime
        self._items: queue.SimpleQueue[Delta | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.published = 0
        self.dropped = 0

    def put(self, deltas: list[Delta]) -> None:
        """Queue deltas (called by the engine loop)."""
        if not deltas:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="delta-publisher", daemon=True
                )
                self._thread.start()
        for d in deltas:
            self._items.put(d)

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued, then stop the thread."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            self._items.put(None)
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            batch: list[Delta] = []
            item = self._items.get()
            stop = item is None
            if item is not None:
                batch.append(item)
            while True:
                try:
                    more = self._items.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                else:
                    batch.append(more)
            if batch:
                try:
                    publish_events(
                        redis_client=self.rt.redis,
                        keys=self.rt.keys,
                        events=[(d.job_id, d.fields()) for d in batch],
                    )
                    self.published += len(batch)
                except redis.RedisError as exc:
                    self.dropped += len(batch)
                    log.warning("dropped %d text deltas (Redis: %s)", len(batch), exc)
            if stop:
                return
