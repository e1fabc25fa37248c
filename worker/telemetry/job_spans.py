"""A job's worker-side timeline turned into spans after its result is written.

The engine loop only notes timestamps (``JobTimeline``); the output writer thread calls
``record_job_spans`` after the commit, creating every span with explicit start and end
times, so no span work happens inside an engine step. Layout (one trace per job, joined to
the producer's ``inflight.enqueue`` span through the message's ``traceparent``)::

    inflight.job                  enqueue (XADD) .. result committed; events: preempted
      inflight.queue_wait         XADD .. read by this worker
      inflight.admission          read .. first scheduled by the engine
      inflight.prefill            first scheduled .. first token
      inflight.decode             first token .. finished
      inflight.result_write       the writer's commit and ack of this job's batch
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry import trace

from worker.telemetry.propagation import context_from_traceparent
from worker.telemetry.timeline import JobTimeline

JOB_SPAN = "inflight.job"
QUEUE_WAIT_SPAN = "inflight.queue_wait"
ADMISSION_SPAN = "inflight.admission"
PREFILL_SPAN = "inflight.prefill"
DECODE_SPAN = "inflight.decode"
RESULT_WRITE_SPAN = "inflight.result_write"
PREEMPTED_EVENT = "preempted"


def _ns(t: float) -> int:
    return int(t * 1e9)


def _child(
    tracer: trace.Tracer,
    parent: trace.Span,
    name: str,
    start: float | None,
    end: float | None,
    attributes: dict[str, int | str] | None = None,
) -> None:
    if start is None or end is None:
        return
    ctx = trace.set_span_in_context(parent)
    span = tracer.start_span(name, context=ctx, start_time=_ns(start), attributes=attributes)
    span.end(end_time=_ns(max(start, end)))


def record_job_spans(
    tracer: trace.Tracer, timelines: Iterable[JobTimeline], *, write_start: float, write_end: float
) -> None:
    """Create and end the spans of jobs whose results were committed between ``write_start``
    and ``write_end`` (one writer transaction). Called from the writer thread."""
    timelines = list(timelines)
    for t in timelines:
        attributes: dict[str, int | str] = {
            "inflight.job.id": t.job_id,
            "inflight.worker": t.worker_id,
            "inflight.queue.class": t.queue_class,
            "inflight.tenant": t.tenant,
            "inflight.job.priority": t.priority,
            "inflight.job.attempt": t.attempt,
            "inflight.job.deliveries": t.deliveries,
            "inflight.job.status": t.status,
            "inflight.job.preemptions": t.num_preemptions,
            "messaging.system": "redis",
            "messaging.operation.type": "process",
        }
        for key, value in (
            ("inflight.job.finish_reason", t.finish_reason),
            ("gen_ai.usage.input_tokens", t.prompt_tokens),
            ("gen_ai.usage.output_tokens", t.completion_tokens),
            ("inflight.job.first_step", t.first_step),
            ("inflight.job.last_step", t.last_step),
        ):
            if value is not None:
                attributes[key] = value
        start = t.start
        job = tracer.start_span(
            JOB_SPAN,
            context=context_from_traceparent(t.traceparent),
            kind=trace.SpanKind.CONSUMER,
            start_time=_ns(start),
            attributes=attributes,
        )
        if not job.is_recording():  # sampled out (the producer's decision): nothing to add
            continue
        if t.enqueued is not None:
            _child(tracer, job, QUEUE_WAIT_SPAN, start, t.received)
        running_from = t.first_scheduled
        _child(tracer, job, ADMISSION_SPAN, t.received, running_from or t.admitted)
        _child(tracer, job, PREFILL_SPAN, running_from, t.first_token or t.finished)
        _child(tracer, job, DECODE_SPAN, t.first_token, t.finished)
        _child(
            tracer,
            job,
            RESULT_WRITE_SPAN,
            write_start,
            write_end,
            {"inflight.write.batch_size": len(timelines)},
        )
        for when, step in t.preemptions:
            job.add_event(PREEMPTED_EVENT, {"inflight.step": step}, timestamp=_ns(when))
        if t.status == "failed":
            job.set_status(trace.Status(trace.StatusCode.ERROR, t.error or "failed"))
        job.end(end_time=_ns(max(start, write_end)))
