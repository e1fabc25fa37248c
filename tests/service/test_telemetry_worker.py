"""Telemetry of the in-process worker on the tiny model: each job enqueued through the
producer is one trace (enqueue → job → queue wait, admission, prefill, decode, result
write), preemptions are span events, and the engine, queue and job metrics are collected."""

from __future__ import annotations

import itertools
import os
import threading
from collections import defaultdict

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.service.conftest import REDIS_URL
from tests.service.helpers import prompt_jobs, wait_for
from worker.jobs.enqueue import enqueue
from worker.service.config import WorkerConfig
from worker.service.worker import WorkerProcess
from worker.store.crud.jobs import get_job
from worker.store.schemas import NewJob
from worker.telemetry import metrics as m
from worker.telemetry import setup

pytestmark = pytest.mark.services

WORKER_CHILDREN = {
    "inflight.queue_wait",
    "inflight.admission",
    "inflight.prefill",
    "inflight.decode",
    "inflight.result_write",
}


@pytest.fixture
def telemetry(monkeypatch: pytest.MonkeyPatch):
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    setup.configure_telemetry(
        "test-worker", span_exporters=[exporter], metric_readers=[reader], set_global=False
    )
    yield exporter, reader
    setup.shutdown_telemetry()


def _engine(config: WorkerConfig):
    from worker.engine import EngineArgs, LLMEngine

    # 6 blocks of 16 tokens for 4 growing sequences: some are preempted
    return LLMEngine(
        EngineArgs(model="tiny-llama", max_num_seqs=4, num_kv_blocks=6, max_model_len=96)
    )


def test_one_trace_per_job_and_metrics(
    telemetry, migrated_pg, session_factory, redis_client, keys
) -> None:
    pytest.importorskip("torch")
    exporter, reader = telemetry
    jobs = prompt_jobs(3, max_tokens=4)
    long = [
        NewJob(
            request={
                "url": "/v1/completions",
                "body": {"prompt": f"long {i}", "max_tokens": 40, "ignore_eos": True},
            }
        )
        for i in range(3)
    ]
    ids = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys, jobs=jobs)
    ids += enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys, jobs=long)
    config = WorkerConfig(
        database_url=migrated_pg, redis_url=REDIS_URL, model="tiny-llama", prefix=keys.prefix,
        name="telemetry", heartbeat_interval=0.3, reconcile_interval=3600,
    )  # fmt: skip
    w = WorkerProcess(config, engine_factory=_engine, install_signals=False)
    t = threading.Thread(target=w.run)
    t.start()
    try:

        def _done() -> bool:
            with session_factory() as s:
                return all(get_job(session=s, job_id=j).status == "succeeded" for j in ids)

        wait_for(_done, timeout=120, what="all jobs to succeed")
        wait_for(lambda: w.loop is not None and w.loop.writer.written >= len(ids), timeout=20,
                 what="the writes")  # fmt: skip
        data = reader.get_metrics_data()  # while the worker is attached
    finally:
        w.stop()
        t.join(60)
    assert not t.is_alive()

    setup.flush_telemetry()
    spans = list(exporter.get_finished_spans())
    by_trace = defaultdict(list)
    for span in spans:
        by_trace[span.context.trace_id].append(span)
    enqueues = {s.attributes["inflight.job.id"]: s for s in spans if s.name == "inflight.enqueue"}
    assert set(enqueues) == set(ids)
    assert len({s.context.trace_id for s in enqueues.values()}) == len(ids)  # a trace per job
    preempted = 0
    for job_id, root in enqueues.items():
        assert root.parent is None
        trace_spans = by_trace[root.context.trace_id]
        [job] = [s for s in trace_spans if s.name == "inflight.job"]
        assert job.parent.span_id == root.context.span_id
        assert job.attributes["inflight.job.id"] == job_id
        assert job.attributes["inflight.job.status"] == "succeeded"
        children = {
            s.name: s for s in trace_spans if s.parent and s.parent.span_id == job.context.span_id
        }
        assert set(children) == WORKER_CHILDREN, (job_id, sorted(children))
        order = ["inflight.queue_wait", "inflight.admission", "inflight.prefill", "inflight.decode"]
        for a, b in itertools.pairwise(order):
            assert children[a].end_time <= children[b].start_time + 1_000_000  # 1 ms slack
        assert children["inflight.decode"].end_time <= children["inflight.result_write"].start_time
        assert job.start_time <= children["inflight.queue_wait"].start_time
        assert job.end_time >= children["inflight.result_write"].end_time
        events = [e for e in job.events if e.name == "preempted"]
        assert len(events) == job.attributes["inflight.job.preemptions"]
        preempted += len(events)
    assert preempted >= 1, "the small KV pool should have preempted someone"

    points: dict[str, list] = defaultdict(list)
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                points[metric.name].extend(metric.data.data_points)
    total = {name: sum(getattr(p, "value", 0) for p in pts) for name, pts in points.items()}
    assert total[m.STEPS] > 0 and total[m.TOKENS_GENERATED] >= 3 * 4 + 3 * 40
    assert total[m.PREEMPTIONS] >= 1
    assert total[m.COMPUTED_PROMPT_TOKENS] > 0 and m.CACHED_PROMPT_TOKENS in total
    assert {m.RUNNING, m.WAITING, m.KV_USAGE, m.KV_BLOCKS_USED} <= set(points)
    streams = {p.attributes["inflight.queue.stream"]: p.value for p in points[m.QUEUE_DEPTH]}
    lanes = [s for s in streams if keys.lane_end(s) is not None]
    assert all(streams[s] == 0 for s in lanes) and keys.interactive in streams
    assert total[m.JOBS_FINISHED] == len(ids)
    for name in (m.QUEUE_TIME, m.TIME_TO_FIRST_TOKEN, m.TIME_PER_OUTPUT_TOKEN, m.E2E_LATENCY):
        assert sum(p.count for p in points[name]) == len(ids), name
