"""A finished engine output turned into the job result the writer stores: status, choice 0
in the text columns, every sample (text, finish and stop reason, token ids, logprobs when
asked) in ``choices``, usage over all samples, and the timeline."""

from __future__ import annotations

from typing import Any

from worker.engine.outputs import RequestOutput
from worker.protocol.openai_batch import Sample, samples_of, stored_choice
from worker.service.held_jobs import HeldJob
from worker.store.base import from_epoch, utcnow
from worker.store.schemas import JobResult


def clean(text: str | None) -> str | None:
    """PostgreSQL text cannot hold NUL, and a random model can emit it."""
    return text.replace("\x00", "\ufffd") if text else text


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
        error=out.error,
        started_at=from_epoch(m.first_scheduled_time),
        first_token_at=from_epoch(m.first_token_time),
        finished_at=from_epoch(m.finished_time) or utcnow(),
        first_step=m.first_step,
        last_step=m.last_step,
        isolation=held.isolation,
        choices=[stored_choice(c) for c in samples] if status == "succeeded" else None,
    )


def _cleaned(sample: Sample) -> Sample:
    sample.text = clean(sample.text) or ""
    if isinstance(sample.stop_reason, str):
        sample.stop_reason = clean(sample.stop_reason)
    for lp in sample.logprobs or ():
        lp.token = clean(lp.token) or ""
        lp.top = [(clean(t) or "", v) for t, v in lp.top]
    return sample
