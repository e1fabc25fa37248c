"""One job submitted through the API and run by an in-process worker is one trace: the HTTP
request span, its ``inflight.enqueue`` child, the worker's ``inflight.job`` under that (the
context rode in the stream message) and the job's stage spans under it. A caller's own
``traceparent`` header is continued."""

from __future__ import annotations

import os
import threading
import time

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.api.conftest import REDIS_URL, ApiEnv
from worker.telemetry import setup

pytestmark = pytest.mark.services

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_TRACEPARENT = f"00-{CALLER_TRACE}-00f067aa0ba902b7-01"


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch):
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    exp = InMemorySpanExporter()
    setup.configure_telemetry("test-api", span_exporters=[exp], set_global=False)
    yield exp
    setup.shutdown_telemetry()


def _engine(config):
    from worker.engine import EngineArgs, LLMEngine

    return LLMEngine(
        EngineArgs(model="tiny-llama", max_num_seqs=8, num_kv_blocks=64, max_model_len=256)
    )


def test_job_through_api_and_worker_is_one_trace(exporter, env: ApiEnv) -> None:
    pytest.importorskip("torch")
    from worker.service.config import WorkerConfig
    from worker.service.worker import WorkerProcess

    config = WorkerConfig(
        database_url=env.settings.database_url, redis_url=REDIS_URL, model="tiny-llama",
        prefix=env.ctx.keys.prefix, name="api-telemetry", heartbeat_interval=0.3,
        reconcile_interval=3600,
    )  # fmt: skip
    w = WorkerProcess(config, engine_factory=_engine, install_signals=False)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    h = env.auth("t-otel")
    try:
        plain = env.client.post("/v1/jobs", json={"prompt": "hello", "max_tokens": 3}, headers=h)
        continued = env.client.post(
            "/v1/jobs",
            json={"prompt": "again", "max_tokens": 3},
            headers={**h, "traceparent": CALLER_TRACEPARENT},
        )
        assert plain.status_code == 201 and continued.status_code == 201
        ids = [plain.json()["id"], continued.json()["id"]]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            got = [env.client.get(f"/v1/jobs/{i}", headers=h).json()["status"] for i in ids]
            if all(s == "succeeded" for s in got) and w.loop and w.loop.writer.written >= 2:
                break
            time.sleep(0.1)
        assert got == ["succeeded", "succeeded"]
    finally:
        w.stop()
        t.join(60)

    setup.flush_telemetry()
    spans = list(exporter.get_finished_spans())
    by_id = {s.context.span_id: s for s in spans}
    for job_id in ids:
        [enqueue] = [
            s for s in spans
            if s.name == "inflight.enqueue" and s.attributes["inflight.job.id"] == job_id
        ]  # fmt: skip
        request = by_id[enqueue.parent.span_id]
        assert request.kind == trace.SpanKind.SERVER and request.name == "POST /v1/jobs"
        assert request.attributes["http.response.status_code"] == 201
        [job] = [
            s for s in spans
            if s.name == "inflight.job" and s.attributes["inflight.job.id"] == job_id
        ]  # fmt: skip
        assert job.parent.span_id == enqueue.context.span_id
        stages = {s.name for s in spans if s.parent and s.parent.span_id == job.context.span_id}
        assert stages == {
            "inflight.queue_wait", "inflight.admission", "inflight.prefill", "inflight.decode",
            "inflight.result_write",
        }  # fmt: skip
        trace_ids = {request.context.trace_id, enqueue.context.trace_id, job.context.trace_id}
        trace_ids |= {
            s.context.trace_id
            for s in spans
            if s.parent and s.parent.span_id == job.context.span_id
        }
        assert len(trace_ids) == 1
        if job_id == ids[0]:
            assert request.parent is None  # the request span is the root
        else:
            assert f"{request.context.trace_id:032x}" == CALLER_TRACE  # the caller's trace
            assert request.parent is not None and request.parent.is_remote
    get_spans = [s for s in spans if s.name == "GET /v1/jobs/{job_id}"]
    assert get_spans, "every request gets a span"
