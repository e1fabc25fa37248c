"""The engine loop (main thread): admit, step, hand results to the writer, apply
cancellations between steps, drain on SIGTERM.

A job that fails validation or tokenization fails alone. If ``engine.step()`` raises, every
job that was in the engine is aborted and a known-good probe runs alone: if it passes, the
jobs are bisected: each half re-runs as a group with nothing else in the engine, a group
that fails again is halved again, and a job that fails on its own is failed with the error.
One bad job among N costs about log2(N) re-runs while the others finish in groups. If the
probe fails too, the engine is broken and every held job is handed back unfailed
(:mod:`worker.service.engine_api`).
"""

from __future__ import annotations

import logging
import threading
import time

from worker.engine.outputs import RequestOutput, StepStats
from worker.queue.job_events import DELTAS, Delta, wanted
from worker.service.delta_publisher import DeltaPublisher
from worker.service.engine_api import EngineAPI, EngineBroken, error_text, probe_engine
from worker.service.held_jobs import HeldJob
from worker.service.isolation import Isolation
from worker.service.loop_output import LoopCounters, LoopResults, charge
from worker.service.observe import JobObserver
from worker.service.prepare import prepare
from worker.service.runtime import WorkerRuntime
from worker.service.stream_text import StreamTexts
from worker.service.writer import OutputWriter

log = logging.getLogger(__name__)


class EngineLoop:
    """Owns the engine; only this thread touches it."""

    def __init__(
        self,
        *,
        runtime: WorkerRuntime,
        engine: EngineAPI,
        writer: OutputWriter,
        observer: JobObserver | None = None,
    ) -> None:
        self.rt, self.engine, self.writer = runtime, engine, writer
        self.lock = threading.Lock()
        self._capacity = engine.admission_capacity()  # the intake's first read sees the room
        self._interactive_room = engine.interactive_capacity()
        self._cancel_requests: set[str] = set()
        self.active: dict[str, HeldJob] = {}
        self.cancelling: set[str] = set()
        self.isolation = Isolation()
        self.counters = LoopCounters()
        self.results = LoopResults(writer=writer, counters=self.counters,
                                   worker_id=runtime.worker_id, tokenizer=engine.tokenizer,
                                   observer=observer)
        self._drain_deadline: float | None = None
        # jobs that asked to stream: their text deltas after each step (stream_text.py)
        self.streams = StreamTexts(engine.tokenizer)
        self.deltas = DeltaPublisher(runtime=runtime)
        self.observer = observer
        self._note_preemptions = observer is not None and observer.tracing

    # -- called from other threads -------------------------------------------------------
    def want(self) -> int:
        """How many more jobs the intake should read now (no hoarding: what the engine can
        admit, plus a small prefetch, minus what is already buffered)."""
        with self.lock:
            if self.isolation_busy():
                return 0
            return self._capacity + self.rt.config.prefetch - len(self.rt.inbox)

    def want_interactive(self) -> int:
        """How many interactive jobs the intake should read now, whatever batch work fills
        the engine: interactive jobs go ahead of batch ones (``EngineArgs.interactive_*``),
        so a batch backlog never keeps the interactive stream unread."""
        with self.lock:
            if self.isolation_busy():
                return 0
            return self._interactive_room - self.rt.inbox.num_interactive()

    def work_totals(self) -> tuple[float, float]:
        """(estimated work of the jobs whose engine output ended, engine-seconds in steps):
        what the intake's measured rate is made of (``worker.service.dispatch``)."""
        return self.counters.work_done, self.counters.step_seconds

    def add_cohort(self, held: list[HeldJob], *, alone: bool) -> None:
        """Run a cohort of suspects (redelivered after their worker died): ``alone`` with
        nothing else in the engine, else beside the normal batch."""
        with self.lock:
            if alone:
                self.isolation.queue(held)
            else:
                self.counters.isolated_runs += 1
                self.rt.inbox.put(held)
        self.rt.work_ready.set()

    def isolation_busy(self) -> bool:
        """True while a group waits to run alone or runs alone."""
        return self.isolation.busy()

    def request_cancel(self, job_ids: set[str]) -> None:
        """Ask for these jobs to be aborted between steps."""
        with self.lock:
            self._cancel_requests |= job_ids
        self.rt.work_ready.set()

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> None:
        """Loop until drained (SIGTERM) or told to stop at once."""
        self._publish_capacity()
        while not self.rt.flags.stop_now.is_set():
            self._apply_cancels()
            if self.rt.flags.draining.is_set():
                if self._drain_step():
                    return
            elif self.isolation_busy():
                self._admit_isolated()
            else:
                self._admit()
            if self.engine.has_unfinished_requests():
                self._step()
            else:
                self.rt.work_ready.wait(0.05)
                self.rt.work_ready.clear()
            self._publish_capacity()

    def _publish_capacity(self) -> None:
        with self.lock:
            cap = (
                0
                if self.rt.flags.draining.is_set() or self.isolation.waiting
                else self.engine.admission_capacity()
            )
            self._capacity = cap
            self._interactive_room = (
                0 if self.rt.flags.draining.is_set() or self.isolation.waiting
                else self.engine.interactive_capacity()
            )
            wanted = cap + self.rt.config.prefetch - len(self.rt.inbox)
        # Wake the intake only when it has something to read: a wake-up on every step costs
        # the engine's matmuls a core's time slice on a small machine.
        if wanted > 0 and not self.isolation_busy():
            self.rt.want_changed.set()

    def _admit(self) -> None:
        if not len(self.rt.inbox):
            return
        with self.lock:
            taken = self.rt.inbox.take(self.engine.admission_capacity())  # interactive first
            for held in taken:
                self._add(held)
            # interactive jobs beyond the free slots: they go ahead of the batch work
            room = self.engine.interactive_capacity()
            for held in self.rt.inbox.take(room, interactive_only=True):
                self._add(held)
            # Not redundant with _publish_capacity: the step that runs before it can be
            # long, and until then want() must not count the admitted jobs as free room.
            self._capacity = self.engine.admission_capacity()
            self._interactive_room = self.engine.interactive_capacity()

    def _admit_isolated(self) -> None:
        """Start the next group waiting to run alone once the engine is empty."""
        with self.lock:
            group = self.isolation.next_group(
                self.active, engine_empty=not self.engine.has_unfinished_requests()
            )
        if not group:
            return
        self.counters.isolated_runs += 1
        log.info("running %d suspect job(s) alone: %s", len(group), [h.job_id for h in group])
        for held in group:
            self._add(held)
        self.isolation.started(h.job_id for h in group if h.job_id in self.active)

    def _add(self, held: HeldJob) -> None:
        msg = held.delivery.message
        assert msg is not None
        if held.grammar_error is not None:  # the intake's bounded compile refused it
            self.results.failed(held, held.grammar_error)
            return
        grammar = {"grammar": held.grammar} if held.grammar is not None else {}
        try:
            prep = prepare(engine=self.engine, stored=msg.body)
            self.engine.add_request(
                held.job_id,
                prep.prompt_token_ids,
                prep.params,
                prompt=prep.prompt,
                priority=msg.priority,
                tenant=msg.tenant,
                service_class=held.service_class,
                **grammar,  # compiled by the intake: nothing compiles on this thread
            )
        except Exception as exc:
            self.results.failed(held, error_text(exc))
            return
        self.active[held.job_id] = held
        if wanted(msg.body) == DELTAS:
            self.streams.add(held.job_id, prep.params)

    def _apply_cancels(self) -> None:
        with self.lock:
            if not self._cancel_requests:
                return
            ids, self._cancel_requests = self._cancel_requests, set()
            waiting = self.rt.inbox.take_ids(ids)
        for h in waiting:
            self.results.cancelled(h)
        for job_id in ids:
            if job_id in self.active and job_id not in self.cancelling:
                self.cancelling.add(job_id)
                self.engine.abort_request(job_id)

    def _step(self) -> None:
        try:
            outputs, stats = self.engine.step(between_layers=self._interject)
        except Exception as exc:
            self._on_step_error(exc)
            return
        self._stepped(outputs, stats)

    def _interject(self) -> None:
        """Between two layers of a long step (``LLMEngine.step``): interactive jobs that
        arrived since it began are added and their prompts computed now, in a step of their
        own (``LLMEngine.interjected_step``), so they wait for a layer, not for the whole
        step. An error here fails the paused step, with what that entails (``_step``)."""
        if (self.rt.flags.draining.is_set() or self.isolation_busy()
                or not self.rt.inbox.num_interactive()):
            return
        with self.lock:
            for held in self.rt.inbox.take(self.engine.interactive_capacity(), interactive_only=True):
                self._add(held)
            self._interactive_room = self.engine.interactive_capacity()
        ran = self.engine.interjected_step()
        if ran is not None:
            self._stepped(*ran)

    def _stepped(self, outputs: list[RequestOutput], stats: StepStats) -> None:
        """Account a step, hand its finished jobs to the writer and its text deltas to the
        publisher, and write its trace row."""
        self.counters.note_step(outputs, stats)
        charge(stats, self.active)  # before the finished jobs leave ``active``
        if stats.num_preemptions and self._note_preemptions:
            assert self.observer is not None
            self.observer.note_preemptions(self.engine, stats)
        deltas: list[Delta] = []
        for out in outputs:
            if out.finished:
                self._finish(out)
            elif out.request_id in self.streams and (d := self.streams.update(out)) is not None:
                deltas.append(d)
        self.deltas.put(deltas)
        if self.rt.config.write_traces:
            self.results.step_trace(stats)

    def _finish(self, out: RequestOutput) -> None:
        held = self.active.pop(out.request_id, None)
        self.streams.discard([out.request_id])
        if held is None:
            return  # aborted for isolation or drain; handled elsewhere
        cancelled = out.request_id in self.cancelling
        self.cancelling.discard(out.request_id)
        self.results.finished(out, held, cancelled=cancelled)

    def _on_step_error(self, exc: Exception) -> None:
        suspects = list(self.active.values())
        log.error("engine step failed with %d jobs in it: %s", len(suspects), error_text(exc))
        self.active.clear()
        self.streams.discard(h.job_id for h in suspects)
        for h in suspects:
            self.engine.abort_request(h.job_id)
            self.cancelling.discard(h.job_id)
        if not probe_engine(self.engine):
            n = self.hand_back_all(suspects)
            raise EngineBroken(
                f"the engine fails a known-good probe too ({error_text(exc)}); "
                f"handed {n} jobs back unfailed"
            ) from exc
        if not suspects:
            return
        if len(suspects) == 1:
            self.results.failed(suspects[0], f"the engine failed on this job: {error_text(exc)}")
            return
        why = f"engine step {self.counters.steps + 1} failed with {len(suspects)} jobs in it ({error_text(exc)})"
        with self.lock:
            self.isolation.bisect(suspects, why=why)

    def hand_back_all(self, extra: list[HeldJob] | None = None) -> int:
        """Stop taking work and hand every held job (``extra``, running, buffered, waiting
        to run alone) back unfailed; returns how many. Also called once the intake stopped,
        for what it delivered meanwhile."""
        self.rt.flags.request_drain()
        with self.lock:
            waiting = self.isolation.take_all()
            left = [*(extra or []), *self.active.values(), *self.rt.inbox.take_all(), *waiting]
        for h in self.active.values():
            self.engine.abort_request(h.job_id)
        self.streams.discard(list(self.active))
        self.active.clear()
        self.results.hand_back(left)
        return len(left)

    def _drain_step(self) -> bool:
        """One drain iteration; True when the loop should end."""
        if self._drain_deadline is None:
            self._drain_deadline = time.monotonic() + self.rt.config.drain_timeout
            log.info("draining: intake stopped, finishing %d running jobs", len(self.active))
            self.rt.intake_stopped.wait(10)  # nothing enters the inbox after this
            with self.lock:
                left = self.rt.inbox.take_all() + self.isolation.take_all()
            self.results.release(left)
        if not self.active and not self.engine.has_unfinished_requests():
            return True
        if time.monotonic() >= self._drain_deadline:
            left = list(self.active.values())
            log.warning("drain deadline reached; handing back %d unfinished jobs", len(left))
            for h in left:
                self.engine.abort_request(h.job_id)
            self.streams.discard(list(self.active))
            self.active.clear()
            self.results.release(left)
            return True
        return False
