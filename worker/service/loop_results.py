"""What leaves the engine loop for the writer: each job's end (its result and, with
telemetry on, its timeline), step traces, and jobs handed back or released unfinished.
The loop says what happened; this module words it as the writer's items."""

from __future__ import annotations

from typing import Any

from worker.engine.outputs import RequestOutput, StepStats
from worker.service.held_jobs import HeldJob
from worker.service.job_result import finished_status, job_result
from worker.service.loop_counters import LoopCounters
from worker.service.observe import JobObserver, trace_row
from worker.service.writer import Finished, HandBack, OutputWriter, Release
from worker.store.schemas import JobResult


class LoopResults:
    """The engine loop's side of the writer's queue."""

    def __init__(
        self,
        *,
        writer: OutputWriter,
        counters: LoopCounters,
        worker_id: str,
        tokenizer: Any,
        observer: JobObserver | None,
    ) -> None:
        self.writer, self.counters, self.worker_id = writer, counters, worker_id
        self.tokenizer = tokenizer
        self.observer = observer if observer is not None and observer.enabled else None

    def failed(self, held: HeldJob, error: str) -> None:
        """The job failed without an engine output (invalid, or failed alone)."""
        self.counters.failed += 1
        self._put(held, JobResult(job_id=held.job_id, status="failed", error=error,
                                  isolation=held.isolation))

    def cancelled(self, held: HeldJob) -> None:
        """The job was cancelled before the engine admitted it."""
        self._put(held, JobResult(job_id=held.job_id, status="cancelled", finish_reason="abort"))

    def finished(self, out: RequestOutput, held: HeldJob, *, cancelled: bool) -> None:
        """The engine's output for the job ended (any status)."""
        self.counters.finished += 1
        status = finished_status(out, cancelled=cancelled)
        result = job_result(out, held, status=status, tokenizer=self.tokenizer)
        self._put(held, result, out)

    def step_trace(self, stats: StepStats) -> None:
        """One row of the ``iterations`` table."""
        self.writer.put(trace_row(self.worker_id, stats))

    def hand_back(self, jobs: list[HeldJob]) -> None:
        """Jobs this worker cannot run (broken engine): requeued, the attempt uncounted."""
        if jobs:
            self.writer.put(HandBack(jobs))

    def release(self, jobs: list[HeldJob]) -> None:
        """Jobs left unfinished by a drain: requeued for another worker."""
        if jobs:
            self.writer.put(Release(jobs))

    def _put(self, held: HeldJob, result: JobResult, out: RequestOutput | None = None) -> None:
        timeline = (
            None
            if self.observer is None
            else self.observer.timeline(held, result, out.metrics if out else None)
        )
        self.writer.put(Finished(result, held, timeline))
