"""The engine loop (main thread): admit, step, hand results to the writer, apply
cancellations between steps, drain on SIGTERM.

A job that fails validation or tokenization fails alone. If ``engine.step()`` raises, every
job that was in the engine is aborted and a known-good probe runs alone: if it passes, the
jobs are bisected: each half re-runs as a group with nothing else in the engine, a group
that fails again is halved again, and a job that fails on its own is failed with the error.
One bad job among N costs about log2(N) re-runs while the others finish in groups. If the
probe fails too, the engine is broken and every held job is handed back unfailed
(:mod:`worker.service.engine_health`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from worker.protocol.sampling_params import InvalidRequestError, SamplingParams
from worker.service.config import WorkerConfig
from worker.service.engine_health import EngineBroken, probe_engine
from worker.service.flags import Flags
from worker.service.inbox import Inbox
from worker.service.inflight import HeldJob
from worker.service.observe import JobObserver
from worker.service.prepare import prepare
from worker.service.writer import Finished, HandBack, OutputWriter, Release
from worker.store.base import from_epoch, utcnow
from worker.store.schemas import JobResult

log = logging.getLogger(__name__)


class EngineAPI(Protocol):
    """What the loop needs of an engine (``worker.engine.LLMEngine`` or a test double)."""

    def tokenize(
        self, prompt: str | None = None, messages: list[dict] | None = None
    ) -> list[int]: ...
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams | None = None,
        *,
        prompt: str | None = None,
        priority: int = 0,
        tenant: str | None = None,
        arrival_time: float | None = None,
    ) -> None: ...
    def abort_request(self, request_id: str) -> None: ...
    def step(self) -> tuple[list[Any], Any]: ...
    def has_unfinished_requests(self) -> bool: ...
    def admission_capacity(self) -> int: ...


def _clean(text: str | None) -> str | None:
    # PostgreSQL text cannot hold NUL; a random model can emit it
    return text.replace("\x00", "\ufffd") if text else text


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, InvalidRequestError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


class EngineLoop:
    """Owns the engine; only this thread touches it."""

    def __init__(
        self,
        *,
        engine: EngineAPI,
        config: WorkerConfig,
        writer: OutputWriter,
        flags: Flags,
        inbox: Inbox,
        work_ready: threading.Event,
        want_changed: threading.Event,
        worker_id: str,
        on_drain: Callable[[], None] = lambda: None,
        observer: JobObserver | None = None,
    ) -> None:
        self.engine = engine
        self.config = config
        self.writer = writer
        self.flags = flags
        self.inbox = inbox
        self.work_ready = work_ready
        self.want_changed = want_changed
        self.worker_id = worker_id
        self.on_drain = on_drain
        self.lock = threading.Lock()
        self._capacity = engine.admission_capacity()  # the intake's first read sees the room
        self._cancel_requests: set[str] = set()
        self.active: dict[str, HeldJob] = {}
        self.cancelling: set[str] = set()
        self.isolate: deque[list[HeldJob]] = deque()  # groups waiting to run alone
        self.isolated_group: set[str] = set()  # the group running alone now
        self.isolated_runs = 0  # groups run alone plus suspect cohorts (a metric)
        self.steps = 0
        self.finished = 0
        self.failed = 0
        self._drain_deadline: float | None = None
        # telemetry: read by observable metrics at collection time; bumped once per step
        self.observer = observer
        self._observe = observer is not None and observer.enabled
        self._note_preemptions = observer is not None and observer.tracing
        self.last_stats: Any = None
        self.generated_tokens = 0
        self.preemptions_total = 0
        self.cached_prompt_tokens = 0
        self.computed_prompt_tokens = 0

    # -- called from other threads -------------------------------------------------------
    def want(self) -> int:
        """How many more jobs the intake should read now (no hoarding: what the engine can
        admit, plus a small prefetch, minus what is already buffered)."""
        with self.lock:
            if self.isolation_busy():
                return 0
            return self._capacity + self.config.prefetch - len(self.inbox)

    def add_cohort(self, held: list[HeldJob], *, alone: bool) -> None:
        """Run a cohort of suspects (redelivered after their worker died): ``alone`` with
        nothing else in the engine, else beside the normal batch."""
        with self.lock:
            if alone:
                self.isolate.append(list(held))
            else:
                self.isolated_runs += 1
                self.inbox.put(held)
        self.work_ready.set()

    def isolation_busy(self) -> bool:
        """True while a group waits to run alone or runs alone."""
        return bool(self.isolate) or bool(self.isolated_group)

    def request_cancel(self, job_ids: set[str]) -> None:
        """Ask for these jobs to be aborted between steps."""
        with self.lock:
            self._cancel_requests |= job_ids
        self.work_ready.set()

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> None:
        """Loop until drained (SIGTERM) or told to stop at once."""
        self._publish_capacity()
        while not self.flags.stop_now.is_set():
            self._apply_cancels()
            if self.flags.draining.is_set():
                if self._drain_step():
                    return
            elif self.isolation_busy():
                self._admit_isolated()
            else:
                self._admit()
            if self.engine.has_unfinished_requests():
                self._step()
            else:
                self.work_ready.wait(0.05)
                self.work_ready.clear()
            self._publish_capacity()

    def _publish_capacity(self) -> None:
        with self.lock:
            cap = (
                0
                if self.flags.draining.is_set() or self.isolate
                else self.engine.admission_capacity()
            )
            self._capacity = cap
            wanted = cap + self.config.prefetch - len(self.inbox)
        # Wake the intake only when it has something to read: a wake-up on every step costs
        # the engine's matmuls a core's time slice on a small machine.
        if wanted > 0 and not self.isolation_busy():
            self.want_changed.set()

    def _admit(self) -> None:
        if not len(self.inbox):
            return
        with self.lock:
            taken = self.inbox.take(self.engine.admission_capacity())
            for held in taken:
                self._add(held)
            # Not redundant with _publish_capacity: the step that runs before it can be
            # long, and until then want() must not count the admitted jobs as free room.
            self._capacity = self.engine.admission_capacity()

    def _admit_isolated(self) -> None:
        """Start the next group waiting to run alone once the engine is empty."""
        self.isolated_group &= self.active.keys()
        if self.isolated_group or self.engine.has_unfinished_requests() or not self.isolate:
            return
        with self.lock:
            group = self.isolate.popleft()
            self.isolated_runs += 1
        log.info("running %d suspect job(s) alone: %s", len(group), [h.job_id for h in group])
        for held in group:
            self._add(held)
        self.isolated_group = {h.job_id for h in group} & self.active.keys()

    def _add(self, held: HeldJob) -> None:
        msg = held.delivery.message
        assert msg is not None
        try:
            prep = prepare(engine=self.engine, stored=msg.body)
            self.engine.add_request(
                held.job_id,
                prep.prompt_token_ids,
                prep.params,
                prompt=prep.prompt,
                priority=msg.priority,
                tenant=msg.tenant,
            )
        except Exception as exc:
            self._fail(held, _error_text(exc))
            return
        self.active[held.job_id] = held

    def _fail(self, held: HeldJob, error: str) -> None:
        self.failed += 1
        result = JobResult(
            job_id=held.job_id, status="failed", error=error, isolation=held.isolation
        )
        self.writer.put(Finished(result, held, self._timeline(held, result)))

    def _timeline(self, held: HeldJob, result: JobResult, metrics: Any = None) -> Any:
        if not self._observe:
            return None
        assert self.observer is not None
        return self.observer.timeline(held, result, metrics)

    def _apply_cancels(self) -> None:
        with self.lock:
            if not self._cancel_requests:
                return
            ids, self._cancel_requests = self._cancel_requests, set()
            waiting = self.inbox.take_ids(ids)
        for h in waiting:
            result = JobResult(job_id=h.job_id, status="cancelled", finish_reason="abort")
            self.writer.put(Finished(result, h, self._timeline(h, result)))
        for job_id in ids:
            if job_id in self.active and job_id not in self.cancelling:
                self.cancelling.add(job_id)
                self.engine.abort_request(job_id)

    def _step(self) -> None:
        try:
            outputs, stats = self.engine.step()
        except Exception as exc:
            self._on_step_error(exc)
            return
        self.steps += 1
        self.last_stats = stats
        # new tokens of this step (several per output when drafts were accepted)
        self.generated_tokens += sum(len(getattr(o, "new_token_ids", ())) for o in outputs)
        if stats.num_preemptions:
            self.preemptions_total += stats.num_preemptions
            if self._note_preemptions:
                assert self.observer is not None
                self.observer.note_preemptions(self.engine, stats)
        self.cached_prompt_tokens += getattr(stats, "num_cached_tokens", 0)
        self.computed_prompt_tokens += stats.num_prefill_tokens
        for out in outputs:
            if out.finished:
                self._finish(out)
        if self.config.write_traces:
            self.writer.put(self._trace_row(stats))

    def _finish(self, out: Any) -> None:
        held = self.active.pop(out.request_id, None)
        if held is None:
            return  # aborted for isolation or drain; handled elsewhere
        m = out.metrics
        if out.request_id in self.cancelling:
            self.cancelling.discard(out.request_id)
            status = "cancelled"
        elif getattr(out, "error", None):
            status = "failed"
        elif out.finish_reason == "abort":
            status = "cancelled"
        else:
            status = "succeeded"
        self.finished += 1
        result = JobResult(
            job_id=held.job_id,
            status=status,
            text=_clean(out.text),
            finish_reason=out.finish_reason,
            prompt_tokens=len(out.prompt_token_ids),
            completion_tokens=len(out.token_ids),
            error=getattr(out, "error", None),
            started_at=from_epoch(getattr(m, "first_scheduled_time", None)),
            first_token_at=from_epoch(m.first_token_time),
            finished_at=from_epoch(m.finished_time) or utcnow(),
            first_step=m.first_step,
            last_step=m.last_step,
            isolation=held.isolation,
        )
        self.writer.put(Finished(result, held, self._timeline(held, result, m)))

    def _trace_row(self, s: Any) -> dict[str, Any]:
        return {
            "worker_id": self.worker_id,
            "step": s.step,
            "time": from_epoch(s.start_time or time.time()),
            "num_running": s.num_running,
            "num_waiting": s.num_waiting,
            "num_prefill_tokens": s.num_prefill_tokens,
            "num_decode_tokens": s.num_decode_tokens,
            "kv_blocks_used": s.kv_blocks_used,
            "kv_blocks_total": s.kv_blocks_total,
            "num_preemptions": s.num_preemptions,
            "num_admitted": s.num_admitted,
            "num_finished": s.num_finished,
            "schedule_ms": s.schedule_seconds * 1000.0,
            "forward_ms": s.forward_seconds * 1000.0,
            "sample_ms": s.sample_seconds * 1000.0,
        }

    def _on_step_error(self, exc: Exception) -> None:
        suspects = list(self.active.values())
        log.error("engine step failed with %d jobs in it: %s", len(suspects), _error_text(exc))
        self.active.clear()
        for h in suspects:
            self.engine.abort_request(h.job_id)
            self.cancelling.discard(h.job_id)
        if not probe_engine(self.engine):
            n = self.hand_back_all(suspects)
            raise EngineBroken(
                f"the engine fails a known-good probe too ({_error_text(exc)}); "
                f"handed {n} jobs back unfailed"
            ) from exc
        if not suspects:
            return
        if len(suspects) == 1:
            self._fail(suspects[0], f"the engine failed on this job: {_error_text(exc)}")
            return
        half = (len(suspects) + 1) // 2
        groups = [suspects[:half], suspects[half:]]
        for group in groups:
            for h in group:
                h.isolation = (
                    f"engine step {self.steps + 1} failed with {len(suspects)} jobs in it "
                    f"({_error_text(exc)}); re-run in an isolated group of {len(group)}"
                )
        with self.lock:
            self.isolate.extendleft(reversed(groups))

    def hand_back_all(self, extra: list[HeldJob] | None = None) -> int:
        """Stop taking work and hand every held job (``extra``, running, buffered, waiting
        to run alone) back unfailed; returns how many. Also called once the intake stopped,
        for what it delivered meanwhile."""
        self.flags.request_drain()
        with self.lock:
            waiting = [h for group in self.isolate for h in group]
            left = [*(extra or []), *self.active.values(), *self.inbox.take_all(), *waiting]
            self.isolate.clear()
            self.isolated_group = set()
        for h in self.active.values():
            self.engine.abort_request(h.job_id)
        self.active.clear()
        if left:
            self.writer.put(HandBack(left))
        return len(left)

    def _drain_step(self) -> bool:
        """One drain iteration; True when the loop should end."""
        if self._drain_deadline is None:
            self._drain_deadline = time.monotonic() + self.config.drain_timeout
            log.info("draining: intake stopped, finishing %d running jobs", len(self.active))
            self.on_drain()
            with self.lock:
                left = self.inbox.take_all() + [h for group in self.isolate for h in group]
                self.isolate.clear()
                self.isolated_group = set()
            if left:
                self.writer.put(Release(left))
        if not self.active and not self.engine.has_unfinished_requests():
            return True
        if time.monotonic() >= self._drain_deadline:
            left = list(self.active.values())
            log.warning("drain deadline reached; handing back %d unfinished jobs", len(left))
            for h in left:
                self.engine.abort_request(h.job_id)
            self.active.clear()
            if left:
                self.writer.put(Release(left))
            return True
        return False
