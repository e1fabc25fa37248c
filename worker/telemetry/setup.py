"""Tracer and meter providers from the standard ``OTEL_*`` variables, created only by an
explicit ``configure_telemetry`` call (never at import).

Off by default: tracing is on when ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``,
``console``) or, when it is unset, when an OTLP endpoint is set; metrics likewise with
``OTEL_METRICS_EXPORTER``. ``OTEL_SDK_DISABLED=true`` turns everything off. Spans go
through a ``BatchSpanProcessor``, metrics through a ``PeriodicExportingMetricReader``
(their ``OTEL_BSP_*`` and ``OTEL_METRIC_EXPORT_*`` settings are read by the SDK).
"""

from __future__ import annotations

import importlib
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import metrics, trace

log = logging.getLogger(__name__)

SCOPE = "inflight"
_TRUE = ("true", "1", "yes", "on")


@dataclass
class Telemetry:
    """The providers this process configured (None: that signal is off)."""

    tracer_provider: Any | None = None  # opentelemetry.sdk.trace.TracerProvider
    meter_provider: Any | None = None  # opentelemetry.sdk.metrics.MeterProvider
    service_name: str = ""
    cache: dict[str, Any] = field(default_factory=dict)  # instruments made on this provider

    @property
    def tracing(self) -> bool:
        """True when spans are recorded and exported."""
        return self.tracer_provider is not None

    @property
    def metrics(self) -> bool:
        """True when metrics are collected and exported."""
        return self.meter_provider is not None


_state = Telemetry()
_NOOP_TRACER = trace.NoOpTracer()
_NOOP_METER = metrics.NoOpMeter(SCOPE)


def current() -> Telemetry:
    """What ``configure_telemetry`` set up (both signals off before it is called)."""
    return _state


def tracing_enabled() -> bool:
    """True when spans are recorded; callers skip all span work otherwise."""
    return _state.tracer_provider is not None


def metrics_enabled() -> bool:
    """True when metrics are collected."""
    return _state.meter_provider is not None


def get_tracer() -> trace.Tracer:
    """The inflight tracer; a no-op tracer while tracing is off."""
    provider = _state.tracer_provider
    if provider is None:
        return _NOOP_TRACER
    tracer = _state.cache.get("tracer")
    if tracer is None:
        tracer = _state.cache["tracer"] = provider.get_tracer(SCOPE)
    return tracer


def get_meter() -> metrics.Meter:
    """The inflight meter; a no-op meter while metrics are off."""
    provider = _state.meter_provider
    if provider is None:
        return _NOOP_METER
    meter = _state.cache.get("meter")
    if meter is None:
        meter = _state.cache["meter"] = provider.get_meter(SCOPE)
    return meter


def exporter_names(signal: str) -> list[str]:
    """Exporters named for ``signal`` (``TRACES`` or ``METRICS``) by ``OTEL_<signal>_EXPORTER``;
    when unset, ``["otlp"]`` if an OTLP endpoint is configured, else none."""
    raw = os.environ.get(f"OTEL_{signal}_EXPORTER", "").strip()
    if not raw:
        endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(
            f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT"
        )
        return ["otlp"] if endpoint else []
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    return [] if "none" in names else names


def sdk_disabled() -> bool:
    """``OTEL_SDK_DISABLED`` is true."""
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() in _TRUE


def _otlp_protocol(signal: str) -> str:
    proto = os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    return proto.strip().lower()


# signal -> (console exporter, OTLP/gRPC exporter, OTLP/HTTP exporter), as "module:Class"
_EXPORTERS = {
    "traces": (
        "opentelemetry.sdk.trace.export:ConsoleSpanExporter",
        "opentelemetry.exporter.otlp.proto.grpc.trace_exporter:OTLPSpanExporter",
        "opentelemetry.exporter.otlp.proto.http.trace_exporter:OTLPSpanExporter",
    ),
    "metrics": (
        "opentelemetry.sdk.metrics.export:ConsoleMetricExporter",
        "opentelemetry.exporter.otlp.proto.grpc.metric_exporter:OTLPMetricExporter",
        "opentelemetry.exporter.otlp.proto.http.metric_exporter:OTLPMetricExporter",
    ),
}


def _instantiate(path: str) -> Any:
    module_name, class_name = path.split(":")
    return getattr(importlib.import_module(module_name), class_name)()


def _exporter(signal: str, name: str) -> Any | None:
    """The exporter ``name`` (console or otlp) for ``signal`` (traces or metrics)."""
    console, grpc, http = _EXPORTERS[signal]
    if name == "console":
        return _instantiate(console)
    if name == "otlp":
        if _otlp_protocol(signal.upper()) == "grpc":
            try:
                return _instantiate(grpc)
            except ImportError:
                log.warning("OTLP gRPC exporter not installed; sending %s over http/protobuf", signal)
        return _instantiate(http)
    log.warning("unknown %s exporter %r ignored (expected otlp, console or none)", signal, name)
    return None


def _span_exporter(name: str) -> Any | None:
    return _exporter("traces", name)


def _metric_exporter(name: str) -> Any | None:
    return _exporter("metrics", name)


def _resource(service_name: str) -> Any:
    from opentelemetry.sdk.resources import Resource

    named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    return Resource.create({} if named else {"service.name": service_name})


def configure_telemetry(
    service_name: str,
    *,
    span_exporters: list[Any] | None = None,
    metric_readers: list[Any] | None = None,
    set_global: bool = True,
) -> Telemetry:
    """Create this process's providers from the ``OTEL_*`` variables (call once, from an
    entry point); returns what is on. ``service_name`` is the default ``service.name``
    (``OTEL_SERVICE_NAME`` wins). Tests pass ``span_exporters`` (each gets its own
    BatchSpanProcessor) and ``metric_readers`` in addition to the configured ones, and
    ``set_global=False`` to leave the global providers alone. A second call shuts the
    previous providers down first."""
    global _state
    shutdown_telemetry()
    if sdk_disabled():
        _state = Telemetry(service_name=service_name)
        return _state
    exporters = [e for n in exporter_names("TRACES") if (e := _span_exporter(n)) is not None]
    exporters += span_exporters or []
    readers: list[Any] = []
    metric_exporters = [
        e for n in exporter_names("METRICS") if (e := _metric_exporter(n)) is not None
    ]
    if metric_exporters:
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        readers = [PeriodicExportingMetricReader(e) for e in metric_exporters]
    readers += metric_readers or []
    tracer_provider = meter_provider = None
    if exporters or readers:
        resource = _resource(service_name)
    if exporters:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        # the sampler comes from OTEL_TRACES_SAMPLER (parent-based always-on by default)
        tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        for exporter in exporters:
            tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
        if set_global:
            trace.set_tracer_provider(tracer_provider)
    if readers:
        from opentelemetry.sdk.metrics import MeterProvider

        meter_provider = MeterProvider(
            metric_readers=readers, resource=resource, shutdown_on_exit=False
        )
        if set_global:
            metrics.set_meter_provider(meter_provider)
    _state = Telemetry(
        tracer_provider=tracer_provider, meter_provider=meter_provider, service_name=service_name
    )
    if tracer_provider or meter_provider:
        _register_atexit()
        log.info(
            "telemetry on (%s): traces %s, metrics %s",
            service_name,
            ",".join(type(e).__name__ for e in exporters) or "off",
            ",".join(type(r).__name__ for r in readers) or "off",
        )
    return _state


_atexit_registered = False


def _register_atexit() -> None:
    global _atexit_registered
    if not _atexit_registered:
        import atexit

        atexit.register(shutdown_telemetry)
        _atexit_registered = True


def flush_telemetry(timeout_ms: int = 10_000) -> None:
    """Export what is buffered now (spans and a metrics collection)."""
    if _state.tracer_provider is not None:
        _state.tracer_provider.force_flush(timeout_ms)
    if _state.meter_provider is not None:
        _state.meter_provider.force_flush(timeout_ms)


def shutdown_telemetry() -> None:
    """Flush and shut down the providers; both signals are off afterwards."""
    global _state
    old, _state = _state, Telemetry(service_name=_state.service_name)
    for provider in (old.tracer_provider, old.meter_provider):
        if provider is not None:
            try:
                provider.shutdown()
            except Exception as exc:  # an exporter that cannot reach its collector
                log.warning("telemetry shutdown: %s", exc)
