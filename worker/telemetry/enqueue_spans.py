"""Producer-side spans: one ``inflight.enqueue`` span per job, whose context rides in the
job's stream message so that the worker's spans join the same trace."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from opentelemetry import trace

from worker.telemetry.propagation import context_from_traceparent, inject_traceparent
from worker.telemetry.setup import get_tracer, tracing_enabled

ENQUEUE_SPAN = "inflight.enqueue"


@dataclass(frozen=True)
class EnqueuedJob:
    """What the enqueue span of one job records."""

    job_id: str
    queue_class: str
    tenant: str = "default"
    priority: int = 0


@contextmanager
def enqueue_spans(
    jobs: Sequence[EnqueuedJob], *, traceparent: str | None = None
) -> Iterator[dict[str, str]]:
    """Open one PRODUCER span per job around the body (the SQL commit and the XADD) and
    yield ``{job_id: traceparent}`` to put in each message.

    The parent is ``traceparent`` when given, else the current span (the HTTP request span
    in the API); with neither, each job starts its own trace. With tracing off nothing is
    created: the dict maps every job to ``traceparent`` when one is given, else it is empty.
    An exception in the body is recorded on the spans and re-raised.
    """
    if not tracing_enabled():
        yield {j.job_id: traceparent for j in jobs} if traceparent else {}
        return
    tracer = get_tracer()
    parent = context_from_traceparent(traceparent)
    spans = []
    out: dict[str, str] = {}
    for job in jobs:
        span = tracer.start_span(
            ENQUEUE_SPAN,
            context=parent,
            kind=trace.SpanKind.PRODUCER,
            attributes={
                "inflight.job.id": job.job_id,
                "inflight.queue.class": job.queue_class,
                "inflight.tenant": job.tenant,
                "inflight.job.priority": job.priority,
                "messaging.system": "redis",
                "messaging.operation.type": "send",
            },
        )
        spans.append(span)
        tp = inject_traceparent(span)
        if tp:
            out[job.job_id] = tp
    try:
        yield out
    except BaseException as exc:
        for span in spans:
            span.record_exception(exc)
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        for span in spans:
            span.end()
