"""A SERVER span per HTTP request when tracing is on (W3C ``traceparent`` honoured), so
that a job's ``inflight.enqueue`` span is the child of the request that submitted it."""

from __future__ import annotations

from opentelemetry import context as otel_context
from opentelemetry import trace
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from worker.telemetry.propagation import context_from_headers
from worker.telemetry.setup import get_tracer, tracing_enabled


class TracingMiddleware:
    """Pure ASGI middleware; passes requests straight through while tracing is off."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not tracing_enabled():
            await self.app(scope, receive, send)
            return
        headers = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in scope.get("headers") or []
            if k in (b"traceparent", b"tracestate")
        }
        method = scope["method"]
        span = get_tracer().start_span(
            method,
            context=context_from_headers(headers),
            kind=trace.SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": scope.get("path", "")},
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        status = 500

        async def tracking_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except BaseException as exc:
            span.record_exception(exc)
            raise
        finally:
            route = getattr(scope.get("route"), "path", None)
            if route:
                span.update_name(f"{method} {route}")
                span.set_attribute("http.route", route)
            span.set_attribute("http.response.status_code", status)
            if status >= 500:
                span.set_status(trace.Status(trace.StatusCode.ERROR))
            otel_context.detach(token)
            span.end()
