"""Prometheus text exposition: HTTP counters and latency kept in-process, plus queue and
store gauges read at scrape time."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Methods counted under their own name; any other method string is counted as OTHER,
# so a client cannot create metric series at will.
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class HttpMetrics:
    """Request counts by (method, route, status) and a latency histogram by route."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, str, int], int] = defaultdict(int)
        self.hist: dict[str, list[int]] = defaultdict(lambda: [0] * (len(BUCKETS) + 1))
        self.sums: dict[str, float] = defaultdict(float)

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        """Record one request."""
        with self._lock:
            self.requests[(method, route, status)] += 1
            counts = self.hist[route]
            for i, edge in enumerate(BUCKETS):
                if seconds <= edge:
                    counts[i] += 1
            counts[-1] += 1
            self.sums[route] += seconds

    def render(self) -> list[str]:
        """Exposition lines for the HTTP metrics."""
        out = [
            "# HELP inflight_http_requests_total HTTP requests served.",
            "# TYPE inflight_http_requests_total counter",
        ]
        with self._lock:
            for (method, route, status), n in sorted(self.requests.items()):
                out.append(
                    f'inflight_http_requests_total{{method="{method}",route="{route}",'
                    f'status="{status}"}} {n}'
                )
            out += [
                "# HELP inflight_http_request_duration_seconds Request latency.",
                "# TYPE inflight_http_request_duration_seconds histogram",
            ]
            for route, counts in sorted(self.hist.items()):
                for edge, n in zip(BUCKETS, counts, strict=False):
                    out.append(
                        f'inflight_http_request_duration_seconds_bucket{{route="{route}",'
                        f'le="{edge}"}} {n}'
                    )
                out.append(
                    f'inflight_http_request_duration_seconds_bucket{{route="{route}",'
                    f'le="+Inf"}} {counts[-1]}'
                )
                out.append(
                    f'inflight_http_request_duration_seconds_count{{route="{route}"}} {counts[-1]}'
                )
                out.append(
                    f'inflight_http_request_duration_seconds_sum{{route="{route}"}} '
                    f"{self.sums[route]:.6f}"
                )
        return out


class MetricsMiddleware:
    """Pure ASGI middleware timing each request under its route template (cheaper than
    Starlette's BaseHTTPMiddleware)."""

    def __init__(self, app: ASGIApp, *, metrics: HttpMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def tracking_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            method = scope["method"] if scope["method"] in KNOWN_METHODS else "OTHER"
            self.metrics.observe(method, route, status, time.perf_counter() - start)


def gauge_lines(name: str, help_text: str, samples: list[tuple[str, float]]) -> list[str]:
    """A gauge family: ``samples`` are (label text such as ``status="queued"``, value)."""
    out = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    for labels, value in samples:
        out.append(f"{name}{{{labels}}} {value}" if labels else f"{name} {value}")
    return out


def label_value(text: str) -> str:
    """``text`` escaped for a Prometheus label value (backslash, quote, newline)."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
