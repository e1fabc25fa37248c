"""Output writer: commits results and step traces in batched transactions, then acks.

Whatever the engine loop produced since the last commit goes into one transaction; the
stream entries of those jobs are acked only after that commit (the finish move,
:mod:`worker.jobs.finish`), so a crash at any point leaves every unwritten job pending in
Redis. Store outages are retried with backoff.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from worker.jobs.finish import finish
from worker.jobs.hand_back import hand_back_jobs
from worker.queue.job_events import end_fields, publish_events, wanted
from worker.service.held_jobs import HeldJob
from worker.service.observe import JobObserver
from worker.service.process_control import retry
from worker.service.runtime import WorkerRuntime
from worker.store.crud.iterations import insert_iterations
from worker.store.schemas import JobResult

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass
class Finished:
    """A job's result plus the held entry to ack once it is written, and its telemetry
    timeline (None while telemetry is off)."""

    result: JobResult
    held: HeldJob | None
    timeline: Any = None


@dataclass
class Release:
    """Jobs handed back unrun (drain): requeued in SQL (the attempt counted) and re-published
    as fresh entries, so no delivery counts against them and no evidence is kept."""

    held: list[HeldJob]


@dataclass
class HandBack:
    """Jobs handed back because this worker's engine broke: requeued in SQL without
    counting the attempt, re-published as fresh entries (the old ones acked) so that
    another worker reads them at once and no delivery counts against them."""

    held: list[HeldJob]


@dataclass
class AckOnly:
    """Entries to ack without writing (a redelivered job that had already ended)."""

    entries: list[tuple[str, str, str | None]]  # stream, entry id, job id


class OutputWriter:
    """The writer thread. ``put`` is called from the engine loop and the intake."""

    def __init__(self, *, runtime: WorkerRuntime, observer: JobObserver | None = None) -> None:
        self.rt = runtime
        self.observer = observer if observer is not None and observer.enabled else None
        self._items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.closing = threading.Event()
        # ``unwritten`` is derived: ``put`` runs on several threads (engine loop, intake) and
        # counts under a lock; ``written``/``unstored`` change on the writer thread only.
        self._put_lock = threading.Lock()
        self._put_finished = 0
        self.written = 0
        self.unstored = 0  # results that could not be stored at all (left pending in Redis)
        self.handed_back = 0  # jobs handed back unfailed after the engine broke
        self.transactions = 0
        # Step traces alone wait (up to the config's trace_flush_interval or
        # trace_flush_rows) and ride along with the next result commit: one commit per
        # engine step would cost the database server CPU the engine needs on a small machine.
        self._rows: list[dict[str, Any]] = []
        self._rows_since = 0.0
        self._thread = threading.Thread(target=self._run, name="output-writer", daemon=True)

    # -- producer side --------------------------------------------------------------------
    @property
    def unwritten(self) -> int:
        """Results put but not yet committed (read by the intake)."""
        return self._put_finished - self.written - self.unstored

    def put(self, item: Finished | Release | HandBack | AckOnly | dict[str, Any]) -> None:
        """Queue a result, a release, an ack, or an iteration row (a dict)."""
        if isinstance(item, Finished):
            with self._put_lock:
                self._put_finished += 1
        self._items.put(item)

    # -- thread ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def close(self, timeout: float | None = None) -> bool:
        """Write everything queued so far, then stop; False if it did not finish in time."""
        self.closing.set()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while not self.rt.flags.stop_now.is_set():
            items: list[Any] = []
            try:
                items.append(self._items.get(timeout=0.05))
            except queue.Empty:
                if self.closing.is_set() and not self._rows:
                    return
            while True:
                try:
                    items.append(self._items.get_nowait())
                except queue.Empty:
                    break
            rows = [i for i in items if isinstance(i, dict)]
            if rows and not self._rows:
                self._rows_since = time.monotonic()
            self._rows += rows
            others = [i for i in items if not isinstance(i, dict)]
            if not others and not self._traces_due():
                continue
            batch, self._rows = others + self._rows, []
            try:
                self._handle(batch)
            except Exception:
                if self.rt.flags.stop_now.is_set():
                    return
                log.exception("output writer failed on a batch of %d items", len(batch))

    def _traces_due(self) -> bool:
        """Buffered step traces must be written now (old, many, or closing)."""
        return bool(self._rows) and (
            self.closing.is_set()
            or len(self._rows) >= self.rt.config.trace_flush_rows
            or time.monotonic() - self._rows_since >= self.rt.config.trace_flush_interval
        )

    def _handle(self, items: list[Any]) -> None:
        finished = [i for i in items if isinstance(i, Finished)]
        rows = [i for i in items if isinstance(i, dict)]
        releases = [h for i in items if isinstance(i, Release) for h in i.held]
        handed = [h for i in items if isinstance(i, HandBack) for h in i.held]
        skipped = [e for i in items if isinstance(i, AckOnly) for e in i.entries]
        write_start = time.time()
        if finished or rows or skipped:
            held = [f.held for f in finished if f.held is not None]
            unstored = finish(
                session_factory=self.rt.session_factory,
                redis_client=self.rt.redis,
                keys=self.rt.keys,
                worker_id=self.rt.worker_id,
                results=[f.result for f in finished],
                entries=[(h.stream, h.entry_id, h.job_id) for h in held],
                skipped=skipped,
                also=self._traces(rows) if rows else None,
                attempt=self._retry,
            )
            if unstored:
                # Neither the result nor a failure could be stored: the entries are left
                # pending (not acked); stop holding them, so that they go idle and are taken
                # over and redelivered (dead-lettered once delivered too often).
                lost = {id(r) for r in unstored}
                finished = [f for f in finished if id(f.result) not in lost]
                self.rt.registry.remove([r.job_id for r in unstored])
                self.unstored += len(unstored)
            if finished or rows:
                self.written += len(finished)
                self.transactions += 1
        if releases:
            self._hand_back(releases, uncount=False)
        if handed:
            self._hand_back(handed, uncount=True)
            self.handed_back += len(handed)
        if finished:
            self.rt.registry.remove([f.result.job_id for f in finished])
            self._announce(finished)
            if self.observer is not None:
                timelines = [f.timeline for f in finished if f.timeline is not None]
                self.observer.written(timelines, write_start, time.time())

    def _retry(self, fn: Callable[[], T], what: str) -> T:
        """Run one step of a move, retried while its store is away (until stopped)."""
        return retry(fn, what=what, stop=self.rt.flags.stop_now)

    @staticmethod
    def _traces(rows: list[dict[str, Any]]) -> Callable[[Session], None]:
        """The step-trace rows' insert, for the results' transaction."""
        return lambda session: insert_iterations(session=session, rows=rows, ignore_conflicts=True)

    def _announce(self, finished: list[Finished]) -> None:
        """Tell whoever waits on a job (its request asked for events) that its result is
        committed. Best effort: a waiter that misses it reads the job from SQL."""
        events = [
            (f.result.job_id, end_fields(f.result.status))
            for f in finished
            if f.held is not None
            and f.held.delivery.message is not None
            and wanted(f.held.delivery.message.body)
        ]
        try:
            publish_events(redis_client=self.rt.redis, keys=self.rt.keys, events=events)
        except Exception as exc:
            log.warning("could not announce the end of %d jobs: %s", len(events), exc)

    def _hand_back(self, handed: list[HeldJob], *, uncount: bool) -> None:
        """Requeue in SQL (``uncount``: the attempt does not count), then re-publish."""
        self._retry(
            lambda: hand_back_jobs(
                session_factory=self.rt.session_factory,
                redis_client=self.rt.redis,
                keys=self.rt.keys,
                worker_id=self.rt.worker_id,
                deliveries=[h.delivery for h in handed],
                uncount=uncount,
            ),
            "hand back",
        )
        self.rt.registry.remove([h.job_id for h in handed])
