"""What leaves the engine loop: its running totals, and the writer's items for each job's
end, each step's trace and the jobs handed back or released unfinished.

- ``LoopCounters``: plain attributes updated once per step by the loop's thread and read by
  the observable metrics (``worker.telemetry.metrics.EngineSource``) and the worker's exit
  summary;
- ``charge``: each step's wall time split across the jobs that computed in it by their
  rows (``worker.engine.step_cost``), added to each held job's ``engine_seconds``;
- ``job_result``: a finished engine output as the result the writer stores: status,
  choice 0 in the text columns, every sample (text, finish and stop reason, token ids,
  logprobs when asked) in ``choices``, usage over all samples (prompt tokens the prefix
  cache served, engine-seconds), and the timeline;
- ``LoopResults``: the loop says what happened, this words it as the writer's items.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from worker.engine.outputs import RequestOutput, StepStats
from worker.engine.step_cost import split_seconds
from worker.protocol.openai_batch import LogprobInfo, Sample, samples_of, stored_choice
from worker.service.held_jobs import HeldJob
from worker.service.observe import JobObserver, trace_row
from worker.service.writer import Finished, HandBack, OutputWriter, Release
from worker.store.base import from_epoch, utcnow
from worker.store.schemas import JobResult


@dataclass
class LoopCounters:
    """Running totals of one engine loop."""

    steps: int = 0
    finished: int = 0  # jobs whose engine output ended (any status)
    failed: int = 0  # jobs failed before or without an engine output
    generated_tokens: int = 0
    preemptions_total: int = 0
    cached_prompt_tokens: int = 0
    computed_prompt_tokens: int = 0
    isolated_runs: int = 0  # suspect cohorts run beside the batch, groups run alone
    step_seconds: float = 0.0  # wall time of the steps, what charge() splits
    # the measured rate's input (worker.service.dispatch), with step_seconds: the estimated
    # work of the jobs whose engine output ended
    work_done: float = 0.0
    last_stats: StepStats | None = None

    def note_step(self, outputs: list[RequestOutput], stats: StepStats) -> None:
        """Count one successful step."""
        self.steps += 1
        self.step_seconds += stats.seconds
        self.last_stats = stats
        # new tokens of this step (several per output when drafts were accepted)
        self.generated_tokens += sum(len(o.new_token_ids) for o in outputs)
        self.preemptions_total += stats.num_preemptions
        self.cached_prompt_tokens += stats.num_cached_tokens
        self.computed_prompt_tokens += stats.num_prefill_tokens


def charge(stats: StepStats, active: Mapping[str, HeldJob]) -> None:
    """Add each job's share of the step's wall time to its ``engine_seconds``: the step's
    seconds split by the rows each request computed (prefix-cache hits are not rows).
    Every request of a step is an active job (the loop admits nothing else), so the shares
    added here sum to the step's time."""
    for job_id, share in split_seconds(stats.seconds, stats.work).items():
        held = active.get(job_id)
        if held is not None:
            held.engine_seconds += share


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
        self.counters.work_done += held.work
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


def finished_status(out: RequestOutput, *, cancelled: bool) -> str:
    """succeeded, failed (the engine failed the request) or cancelled (asked, or aborted)."""
    if cancelled:
        return "cancelled"
    if out.error:
        return "failed"
    return "cancelled" if out.finish_reason == "abort" else "succeeded"


def job_result(out: RequestOutput, held: HeldJob, *, status: str, tokenizer: Any) -> JobResult:
    """The stored result of finished ``out`` for ``held``; the
    ``tokenizer`` names logprob tokens (needed only when the request asked for logprobs)."""
    samples = [_cleaned(c) for c in samples_of(out, tokenizer)]
    m = out.metrics
    return JobResult(
        job_id=held.job_id,
        status=status,
        text=clean(out.text),
        finish_reason=out.finish_reason,
        prompt_tokens=len(out.prompt_token_ids),
        completion_tokens=sum(len(c.token_ids or ()) for c in samples),
        cached_tokens=m.num_cached_tokens,
        engine_seconds=held.engine_seconds,
        error=out.error,
        started_at=from_epoch(m.first_scheduled_time),
        first_token_at=from_epoch(m.first_token_time),
        finished_at=from_epoch(m.finished_time) or utcnow(),
        first_step=m.first_step,
        last_step=m.last_step,
        isolation=held.isolation,
        choices=[stored_choice(c) for c in samples] if status == "succeeded" else None,
    )


def clean(text: str | None) -> str | None:
    """PostgreSQL text cannot hold NUL, and a random model can emit it."""
    return text.replace("\x00", "\ufffd") if text else text


def _cleaned(sample: Sample) -> Sample:
    sample.text = clean(sample.text) or ""
    if isinstance(sample.stop_reason, str):
        sample.stop_reason = clean(sample.stop_reason)
    for lp in sample.logprobs or ():
        clean_logprob(lp)
    return sample


def clean_logprob(lp: LogprobInfo) -> LogprobInfo:
    """``lp`` with its token texts :func:`clean`."""
    lp.token = clean(lp.token) or ""
    lp.top = [(clean(t) or "", v) for t, v in lp.top]
    return lp
