"""Telemetry without services: off unless OTEL_* configures it, exporters chosen from the
environment, enqueue spans and the message's traceparent, a job timeline turned into nested
spans, engine metrics read from a loop's counters."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from worker.service.loop_output import LoopCounters
from worker.telemetry import setup
from worker.telemetry.enqueue_spans import ENQUEUE_SPAN, EnqueuedJob, enqueue_spans
from worker.telemetry.job_spans import record_job_spans
from worker.telemetry.propagation import context_from_traceparent, inject_traceparent
from worker.telemetry.timeline import JobTimeline


@pytest.fixture(autouse=True)
def no_otel_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts with no OTEL_* variable and no providers, and ends with none."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    setup.shutdown_telemetry()
    yield
    setup.shutdown_telemetry()


def _spans(exporter: InMemorySpanExporter) -> list:
    setup.flush_telemetry()
    return list(exporter.get_finished_spans())


def test_off_without_configuration() -> None:
    state = setup.configure_telemetry("test", set_global=False)
    assert not state.tracing and not state.metrics
    assert not setup.tracing_enabled() and not setup.metrics_enabled()
    span = setup.get_tracer().start_span("x")
    assert not span.is_recording() and not span.get_span_context().is_valid
    span.end()
    assert inject_traceparent() is None
    with enqueue_spans([EnqueuedJob("j1", "batch")]) as traceparents:
        assert traceparents == {}
    given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with enqueue_spans([EnqueuedJob("j1", "batch")], traceparent=given) as traceparents:
        assert traceparents == {"j1": given}  # passed through untouched
    from worker.telemetry.metrics import worker_metrics

    assert worker_metrics() is None


def test_sdk_disabled_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "console")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    state = setup.configure_telemetry("test", set_global=False)
    assert not state.tracing and not state.metrics
    assert state.tracer_provider is None and state.meter_provider is None
    with enqueue_spans([EnqueuedJob("j1", "batch")]) as traceparents:
        assert traceparents == {}


def test_exporters_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert setup.exporter_names("TRACES") == [] and setup.exporter_names("METRICS") == []
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    assert setup.exporter_names("TRACES") == ["otlp"] == setup.exporter_names("METRICS")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    assert setup.exporter_names("METRICS") == []
    state = setup.configure_telemetry("test", set_global=False)
    assert state.tracing and not state.metrics
    processors = state.tracer_provider._active_span_processor._span_processors
    assert [type(p).__name__ for p in processors] == ["BatchSpanProcessor"]
    assert type(processors[0].span_exporter).__name__ == "OTLPSpanExporter"
    assert state.tracer_provider.resource.attributes["service.name"] == "test"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    state = setup.configure_telemetry("test", set_global=False)
    assert state.tracer_provider.resource.attributes["service.name"] == "from-env"
    setup.shutdown_telemetry()  # nothing recorded: nothing is sent


def test_console_exporter_prints_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    state = setup.configure_telemetry("test", set_global=False)
    assert state.tracing and not state.metrics
    [processor] = state.tracer_provider._active_span_processor._span_processors
    assert type(processor).__name__ == "BatchSpanProcessor"
    assert type(processor.span_exporter).__name__ == "ConsoleSpanExporter"
    processor.span_exporter.out = out = io.StringIO()
    with enqueue_spans([EnqueuedJob("job-console", "interactive")]):
        pass
    setup.shutdown_telemetry()
    assert ENQUEUE_SPAN in out.getvalue() and "job-console" in out.getvalue()


def test_enqueue_spans_one_trace_per_job_or_under_the_current_span() -> None:
    exporter = InMemorySpanExporter()
    setup.configure_telemetry("test", span_exporters=[exporter], set_global=False)
    jobs = [EnqueuedJob("a", "batch", "t1", 2), EnqueuedJob("b", "interactive")]
    with enqueue_spans(jobs) as traceparents:
        assert set(traceparents) == {"a", "b"}
    spans = {s.attributes["inflight.job.id"]: s for s in _spans(exporter)}
    assert spans["a"].parent is None and spans["b"].parent is None
    assert spans["a"].context.trace_id != spans["b"].context.trace_id
    assert spans["a"].kind == trace.SpanKind.PRODUCER
    assert spans["a"].attributes["inflight.tenant"] == "t1"
    ctx = context_from_traceparent(traceparents["a"])
    assert ctx is not None
    parent = trace.get_current_span(ctx).get_span_context()
    assert (parent.trace_id, parent.span_id) == (
        spans["a"].context.trace_id,
        spans["a"].context.span_id,
    )
    exporter.clear()
    tracer = setup.get_tracer()
    with (
        tracer.start_as_current_span("request") as request,
        enqueue_spans([EnqueuedJob("c", "batch")]),
    ):
        pass
    with pytest.raises(RuntimeError), enqueue_spans([EnqueuedJob("d", "batch")]):
        raise RuntimeError("redis down")
    spans = {s.name + s.attributes.get("inflight.job.id", ""): s for s in _spans(exporter)}
    child = spans[ENQUEUE_SPAN + "c"]
    assert child.parent.span_id == request.get_span_context().span_id
    assert child.context.trace_id == request.get_span_context().trace_id
    assert spans[ENQUEUE_SPAN + "d"].status.status_code == trace.StatusCode.ERROR
    assert context_from_traceparent("garbage") is None and context_from_traceparent(None) is None


def test_job_timeline_becomes_nested_spans() -> None:
    exporter = InMemorySpanExporter()
    setup.configure_telemetry("test", span_exporters=[exporter], set_global=False)
    with enqueue_spans([EnqueuedJob("j", "batch")]) as traceparents:
        pass
    t0 = time.time()
    timeline = JobTimeline(
        job_id="j",
        worker_id="w1",
        queue_class="batch",
        traceparent=traceparents["j"],
        enqueued=t0,
        received=t0 + 1,
        admitted=t0 + 1.5,
        first_scheduled=t0 + 2,
        first_token=t0 + 3,
        finished=t0 + 5,
        status="succeeded",
        prompt_tokens=7,
        completion_tokens=4,
        num_preemptions=1,
        preemptions=[(t0 + 4, 12)],
    )
    record_job_spans(setup.get_tracer(), [timeline], write_start=t0 + 5.5, write_end=t0 + 6)
    spans = {s.name: s for s in _spans(exporter)}
    enqueue, job = spans["inflight.enqueue"], spans["inflight.job"]
    assert job.parent.span_id == enqueue.context.span_id
    assert job.context.trace_id == enqueue.context.trace_id
    assert job.kind == trace.SpanKind.CONSUMER
    expected = {
        "inflight.queue_wait": (0, 1),
        "inflight.admission": (1, 2),
        "inflight.prefill": (2, 3),
        "inflight.decode": (3, 5),
        "inflight.result_write": (5.5, 6),
    }
    for name, (start, end) in expected.items():
        span = spans[name]
        assert span.parent.span_id == job.context.span_id, name
        assert span.context.trace_id == job.context.trace_id
        assert abs(span.start_time / 1e9 - (t0 + start)) < 1e-3, name
        assert abs(span.end_time / 1e9 - (t0 + end)) < 1e-3, name
    assert abs(job.start_time / 1e9 - t0) < 1e-3 and abs(job.end_time / 1e9 - (t0 + 6)) < 1e-3
    [event] = job.events
    assert event.name == "preempted" and event.attributes["inflight.step"] == 12
    assert job.attributes["gen_ai.usage.output_tokens"] == 4


def test_failed_job_without_engine_times() -> None:
    exporter = InMemorySpanExporter()
    setup.configure_telemetry("test", span_exporters=[exporter], set_global=False)
    now = time.time()
    timeline = JobTimeline(
        job_id="bad", worker_id="w", queue_class="batch", received=now, status="failed",
        error="bogus field",
    )  # fmt: skip
    record_job_spans(setup.get_tracer(), [timeline], write_start=now, write_end=now + 0.01)
    spans = {s.name: s for s in _spans(exporter)}
    assert set(spans) == {"inflight.job", "inflight.result_write"}
    assert spans["inflight.job"].parent is None  # no traceparent: a trace of its own
    assert spans["inflight.job"].status.status_code == trace.StatusCode.ERROR


def _points(reader: InMemoryMetricReader) -> dict[str, list]:
    data = reader.get_metrics_data()
    out: dict[str, list] = {}
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out


def test_worker_metrics_read_the_loop_and_record_jobs() -> None:
    from worker.telemetry import metrics as m

    reader = InMemoryMetricReader()
    setup.configure_telemetry("test", metric_readers=[reader], set_global=False)
    wm = m.worker_metrics()
    assert wm is not None and m.worker_metrics() is wm
    stats = SimpleNamespace(num_running=3, num_waiting=2, kv_blocks_used=5, kv_blocks_total=20)
    loop = LoopCounters(  # what a worker attaches: every metric reads a field of it
        last_stats=stats, steps=9, generated_tokens=40, preemptions_total=1,
        cached_prompt_tokens=32, computed_prompt_tokens=96, isolated_runs=4,
    )  # fmt: skip
    wm.attach("w1", loop, lambda: {"p:jobs:batch": (7, 2), "p:jobs:interactive": (0, 0)})
    t0 = time.time()
    done = JobTimeline(
        job_id="j", worker_id="w1", queue_class="batch", enqueued=t0, received=t0 + 0.5,
        first_scheduled=t0 + 1, first_token=t0 + 2, finished=t0 + 4, completion_tokens=5,
        status="succeeded",
    )  # fmt: skip
    failed = JobTimeline(
        job_id="f", worker_id="w1", queue_class="batch", received=t0, status="failed"
    )
    wm.record_jobs([done, failed], written_at=t0 + 5)
    points = _points(reader)
    value = {
        name: [p.value for p in pts] for name, pts in points.items() if hasattr(pts[0], "value")
    }
    assert value[m.RUNNING] == [3] and value[m.WAITING] == [2]
    assert value[m.KV_USAGE] == [0.25] and value[m.KV_BLOCKS_USED] == [5]
    assert value[m.STEPS] == [9] and value[m.TOKENS_GENERATED] == [40]
    assert value[m.PREEMPTIONS] == [1] and value[m.ISOLATED_RUNS] == [4]
    assert value[m.CACHED_PROMPT_TOKENS] == [32] and value[m.COMPUTED_PROMPT_TOKENS] == [96]
    depth = {p.attributes["inflight.queue.stream"]: p.value for p in points[m.QUEUE_DEPTH]}
    assert depth == {"p:jobs:batch": 7, "p:jobs:interactive": 0}
    assert {p.attributes["inflight.queue.stream"]: p.value for p in points[m.QUEUE_PENDING]}[
        "p:jobs:batch"
    ] == 2
    finished = {p.attributes["inflight.job.status"]: p.value for p in points[m.JOBS_FINISHED]}
    assert finished == {"succeeded": 1, "failed": 1}
    sums = {name: (points[name][0].count, points[name][0].sum) for name in
            (m.QUEUE_TIME, m.TIME_TO_FIRST_TOKEN, m.TIME_PER_OUTPUT_TOKEN, m.E2E_LATENCY)}  # fmt: skip
    assert sums[m.QUEUE_TIME] == (1, pytest.approx(1.0))
    assert sums[m.TIME_TO_FIRST_TOKEN] == (1, pytest.approx(2.0))
    assert sums[m.TIME_PER_OUTPUT_TOKEN] == (1, pytest.approx(0.5))
    assert sums[m.E2E_LATENCY] == (1, pytest.approx(5.0))
    wm.detach("w1")
    assert m.RUNNING not in _points(reader)
