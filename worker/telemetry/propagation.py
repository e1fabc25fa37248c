"""W3C trace context in and out of the ``traceparent`` field of a stream message."""

from __future__ import annotations

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()


def inject_traceparent(span: trace.Span | None = None) -> str | None:
    """The ``traceparent`` header value of ``span`` (default: the current span); None when
    there is no valid span context (tracing off, or no span)."""
    ctx = trace.set_span_in_context(span) if span is not None else None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=ctx)
    return carrier.get("traceparent")


def context_from_traceparent(traceparent: str | None) -> otel_context.Context | None:
    """A context whose parent span is the one ``traceparent`` names; None when it is empty
    or malformed (the span then starts a new trace)."""
    if not traceparent:
        return None
    ctx = _PROPAGATOR.extract({"traceparent": traceparent})
    if not trace.get_current_span(ctx).get_span_context().is_valid:
        return None
    return ctx


def context_from_headers(headers: dict[str, str]) -> otel_context.Context:
    """The context a request's ``traceparent`` / ``tracestate`` headers carry (lower-case
    names); an empty context when they carry none."""
    return _PROPAGATOR.extract(headers)
