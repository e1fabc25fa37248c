"""Intake: pulls from Redis only what the engine can admit soon, interactive first, then
batch work from the lanes in least-slack order (``worker.service.dispatch``).

On start it first replays this consumer's own pending entries; every ``claim_interval`` it
takes over entries left idle by dead workers (and replays those the same way). Entries
delivered once before go back into normal batches; entries delivered more often are
suspects and run in cohorts sized by the evidence against them (``worker.queue.suspects``):
a job is dead-lettered when its worker died while it ran alone, or past the delivery limit.
Redelivered jobs that already ended are acked and skipped; the rest are marked running in
SQL and handed to the engine loop.
"""

from __future__ import annotations

import functools
import logging
import threading
import time

from worker.jobs.dead_letter import dead_letter
from worker.jobs.start import start
from worker.protocol.work_estimate import work_estimate
from worker.queue.claim import take_over_stale
from worker.queue.consumer import own_pending, read_new, redeliver, touch
from worker.queue.dead_letter import over_limit
from worker.queue.delivery import Delivery
from worker.queue.suspects import choose_cohort, open_runs, read_evidence
from worker.service.dispatch import Dispatch
from worker.service.grammars import WorkerGrammars
from worker.service.held_jobs import HeldJob
from worker.service.process_control import retry
from worker.service.runtime import LoopDesk, WorkerRuntime
from worker.service.writer import AckOnly, OutputWriter

log = logging.getLogger(__name__)


class Intake:
    """The intake thread. The engine loop says how many jobs it wants (``loop.want()``);
    intake puts HeldJobs in the runtime's ``inbox`` and sets ``work_ready``."""

    def __init__(
        self, *, runtime: WorkerRuntime, writer: OutputWriter, loop: LoopDesk,
        grammars: WorkerGrammars | None = None,
    ) -> None:
        self.rt = runtime
        self.writer, self.loop = writer, loop
        self.grammars = grammars  # structured output compiled here, bounded, before the inbox
        self._cohort: set[str] = set()  # job ids of the suspect cohort running now
        self.received = 0
        self.skipped = 0
        self.dead_lettered = 0
        self.replayed = 0
        self.claimed = 0
        self._claim_cursors: dict[str, str] = {}  # where each stream's stale scan resumes
        self.dispatch = Dispatch(runtime, loop.work_totals)  # the order the lanes are read in
        self._thread = threading.Thread(target=self._run, name="intake", daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end (it ends once draining is requested)."""
        self._thread.join(timeout)

    def _stopped(self) -> bool:
        return self.rt.flags.draining.is_set()

    def _run(self) -> None:
        try:
            self._read()
        finally:
            self.rt.intake_stopped.set()  # a drain now takes back what the inbox holds

    def _read(self) -> None:
        """Read until draining is requested."""
        c = self.rt.config
        backlog_due: float | None = time.monotonic()  # first: this consumer's own pending
        next_claim = time.monotonic() + c.claim_interval / 2
        while not self._stopped():
            try:
                want = self.loop.want()
                if self.writer.unwritten > c.max_unwritten:
                    want = 0
                now = time.monotonic()
                if want > 0 and now >= next_claim:
                    next_claim = now + c.claim_interval
                    taken = take_over_stale(
                        redis_client=self.rt.redis,
                        keys=self.rt.keys,
                        consumer=self.rt.consumer,
                        min_idle_ms=c.claim_idle_ms,
                        count=want,
                        cursors=self._claim_cursors,
                    )
                    if taken:
                        self.claimed += len(taken)
                        log.info("took over %d entries left idle by a dead worker", len(taken))
                        backlog_due = now
                if backlog_due is not None and now >= backlog_due:
                    backlog_due = self._work_backlog(want)
                    continue
                if want <= 0 and self.writer.unwritten <= c.max_unwritten and self.loop.want_interactive() > 0:
                    # the engine is full (of batch work): still read the interactive stream
                    got = read_new(
                        redis_client=self.rt.redis,
                        keys=self.rt.keys,
                        consumer=self.rt.consumer,
                        count=self.loop.want_interactive(),
                        block_ms=50,
                        streams=[self.rt.keys.stream("interactive")],
                    )
                    if got:
                        self.accept(got)
                    continue
                if want <= 0:
                    self.rt.want_changed.wait(0.05)
                    self.rt.want_changed.clear()
                    continue
                got = read_new(
                    redis_client=self.rt.redis,
                    keys=self.rt.keys,
                    consumer=self.rt.consumer,
                    count=want,
                    block_ms=100,
                    streams=self.dispatch.streams(),
                    block_streams=self.dispatch.watched(),
                )
                if len(got) < want:
                    self.dispatch.read_short()
                if got:
                    self.accept(got)
            except Exception as exc:
                if self._stopped():
                    break
                log.warning("intake error (%s: %s); retrying", type(exc).__name__, exc)
                self.rt.flags.draining.wait(0.5)

    def _work_backlog(self, want: int) -> float | None:
        """Redeliver entries this consumer owns but does not hold (left by its previous
        process, or taken over from a dead worker). Entries delivered at most once go in
        batches as room allows; those delivered more often are suspects and go in cohorts
        (:meth:`_run_cohort`). Returns when to look again (None: the backlog is empty)."""
        held = {(s, e) for s, e in self.rt.registry.entries()}
        owned = own_pending(
            redis_client=self.rt.redis, keys=self.rt.keys, consumer=self.rt.consumer
        )
        pending = [p for p in owned if (p[0], p[1]) not in held]
        if not pending:
            return None
        fresh = [(s, e) for s, e, n in pending if n <= 1]
        suspects = [(s, e) for s, e, n in pending if n > 1]
        if fresh and want > 0:
            got = redeliver(
                redis_client=self.rt.redis,
                keys=self.rt.keys,
                consumer=self.rt.consumer,
                entries=fresh[:want],
            )
            self.replayed += len(got)
            self.accept(got)
            return time.monotonic()
        if suspects and not fresh and not self._cohort_busy() and self._run_cohort(suspects, want):
            return time.monotonic()
        self.touch_backlog(pending)
        return time.monotonic() + 0.1

    def _cohort_busy(self) -> bool:
        return self.rt.registry.holds_any(self._cohort) or self.loop.isolation_busy()

    def _run_cohort(self, suspects: list[tuple[str, str]], want: int) -> bool:
        """Start the next cohort of suspects (``worker.queue.suspects.choose_cohort``), or
        dead-letter those proven guilty; False when a cohort must wait for room."""
        evidence = read_evidence(redis_client=self.rt.redis, keys=self.rt.keys, entries=suspects)
        choice = choose_cohort(suspects, evidence, want)
        entries = choice.guilty or choice.cohort
        if not entries:
            return False
        if choice.cohort:  # recorded before any member runs, so a death mid-run is seen
            cohort = {e: evidence[e] for e in choice.cohort}
            open_runs(redis_client=self.rt.redis, keys=self.rt.keys, cohort=cohort,
                      worker=self.rt.worker_id)
        got = redeliver(redis_client=self.rt.redis, keys=self.rt.keys, consumer=self.rt.consumer,
                        entries=entries)
        told = {(d.stream, d.entry_id): evidence[(d.stream, d.entry_id)].describe() for d in got}
        if choice.guilty:
            self._dead_letter(
                got, "its worker died while it ran alone: it reproduces the failure by itself", told)
            return True
        self.replayed += len(got)
        alone = len(choice.cohort) == 1
        how = "alone" if alone else f"in a cohort of {len(choice.cohort)} suspects"
        notes = {k: f"redelivered: {v}; ran {how}" for k, v in told.items()}
        self._cohort = {d.job_id for d in got if d.job_id}
        log.info("running a cohort of %d suspect job(s)%s", len(got), " alone" if alone else "")
        self.accept(got, cohort_alone=alone, notes=notes)
        return True

    def touch_backlog(self, pending: list[tuple[str, str, int]]) -> None:
        """Keep owned-but-waiting entries from looking stale to other workers."""
        touch(
            redis_client=self.rt.redis,
            keys=self.rt.keys,
            consumer=self.rt.consumer,
            entries=[(s, e) for s, e, _ in pending],
        )

    def accept(
        self,
        deliveries: list[Delivery],
        *,
        cohort_alone: bool | None = None,
        notes: dict[tuple[str, str], str] | None = None,
    ) -> None:
        """Dead-letter, skip or hold what was delivered (one SQL round trip for the lot).
        ``cohort_alone`` (None: not a cohort) runs the held jobs as a cohort of suspects;
        ``notes`` says why each runs isolated, kept with its result."""
        if not deliveries:
            return
        notes = notes or {}
        self.received += len(deliveries)
        unreadable = [d for d in deliveries if d.message is None]
        over = [
            d
            for d in deliveries
            if d.message is not None and over_limit(d, max_deliveries=self.rt.config.max_deliveries)
        ]
        self._dead_letter(unreadable, "unreadable message")
        self._dead_letter(
            over,
            f"delivered more than {self.rt.config.max_deliveries} times without a result "
            "(it crashed or stalled its worker each time)",
            notes,
        )
        dead_ids = {id(d) for d in unreadable + over}
        live = [d for d in deliveries if id(d) not in dead_ids]
        # Held (so kept touched) before the SQL start: if the store hangs right there, no
        # other worker takes these entries over while this one waits to run them.
        skip: list[Delivery] = []
        taken: list[HeldJob] = []
        for d in live:
            h = HeldJob(
                job_id=d.job_id or "",
                stream=d.stream,
                entry_id=d.entry_id,
                delivery=d,
                isolation=notes.get((d.stream, d.entry_id)),
                work=work_estimate(d.message.body) if d.message is not None else 0,
            )
            if d.job_id and self.rt.registry.add(h):
                taken.append(h)
            else:
                skip.append(d)  # a duplicate delivery of a job held already
        ids = [h.job_id for h in taken]
        allowed: set[str] = set()
        if ids:
            try:
                allowed = retry(
                    lambda: self._start(ids), what="mark running", stop=self.rt.flags.draining
                )
            except Exception:
                self.rt.registry.remove(ids)  # left pending in Redis: redelivered later
                raise
        held = [h for h in taken if h.job_id in allowed]
        ended = [h for h in taken if h.job_id not in allowed]
        self.rt.registry.remove([h.job_id for h in ended])
        skip += [h.delivery for h in ended]
        if skip:
            self.skipped += len(skip)
            self.writer.put(AckOnly([(d.stream, d.entry_id, d.job_id) for d in skip]))
        if held and self.grammars is not None:
            self.grammars.prepare(held)  # off the engine thread, outside the loop's lock
        if held and cohort_alone is not None:
            self.loop.add_cohort(held, alone=cohort_alone)
        elif held:
            self.rt.inbox.put(held)
            self.rt.work_ready.set()

    def _dead_letter(
        self, deliveries: list[Delivery], reason: str, evidence: dict[tuple[str, str], str] | None = None
    ) -> None:
        if not deliveries:
            return
        retry(
            functools.partial(
                dead_letter,
                redis_client=self.rt.redis,
                session_factory=self.rt.session_factory,
                keys=self.rt.keys,
                deliveries=deliveries,
                reason=reason,
                evidence=evidence,
            ),
            what="dead-letter",
            stop=self.rt.flags.draining,
        )
        self.dead_lettered += len(deliveries)

    def _start(self, ids: list[str]) -> set[str]:
        return start(
            session_factory=self.rt.session_factory, job_ids=ids, worker_id=self.rt.worker_id
        )
