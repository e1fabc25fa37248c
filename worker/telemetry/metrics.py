"""Worker metrics: engine gauges and counters read from the engine loop's last step (no
work per step), queue depth per stream, and job latency histograms recorded by the output
writer thread after a commit.

Observable instruments call back at collection time (every ``OTEL_METRIC_EXPORT_INTERVAL``)
into the sources that workers ``attach``; one process may hold several workers (tests).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from worker.telemetry.setup import current, get_meter
from worker.telemetry.timeline import JobTimeline

log = logging.getLogger(__name__)

# name: (unit, description)
RUNNING = "inflight.engine.running"
WAITING = "inflight.engine.waiting"
KV_USAGE = "inflight.engine.kv_cache.usage"
KV_BLOCKS_USED = "inflight.engine.kv_cache.blocks_used"
STEPS = "inflight.engine.steps"
TOKENS_GENERATED = "inflight.engine.tokens.generated"
PREEMPTIONS = "inflight.engine.preemptions"
CACHED_PROMPT_TOKENS = "inflight.engine.prefix_cache.cached_tokens"
COMPUTED_PROMPT_TOKENS = "inflight.engine.prefix_cache.computed_tokens"
ISOLATED_RUNS = "inflight.worker.isolated_runs"
QUEUE_DEPTH = "inflight.queue.depth"
QUEUE_PENDING = "inflight.queue.pending"
JOBS_FINISHED = "inflight.jobs.finished"
QUEUE_TIME = "inflight.job.queue_time"
TIME_TO_FIRST_TOKEN = "inflight.job.time_to_first_token"
TIME_PER_OUTPUT_TOKEN = "inflight.job.time_per_output_token"
E2E_LATENCY = "inflight.job.e2e_latency"

LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    600.0, 1800.0, 3600.0,
)  # fmt: skip
TPOT_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5,
    1.0, 2.5,
)  # fmt: skip


class EngineSource(Protocol):
    """What an engine loop exposes (plain attributes it updates once per step)."""

    last_stats: Any  # the last StepStats, or None before the first step
    steps: int
    generated_tokens: int
    preemptions_total: int
    cached_prompt_tokens: int
    computed_prompt_tokens: int
    isolated_runs: int


QueueDepthFn = Callable[[], dict[str, tuple[int, int]]]  # stream -> (undelivered, pending)


@dataclass
class _Attached:
    source: EngineSource
    queue_depth: QueueDepthFn | None


class WorkerMetrics:
    """The worker's instruments on one meter."""

    def __init__(self, meter: metrics.Meter) -> None:
        self._lock = threading.Lock()
        self._attached: dict[str, _Attached] = {}
        gauges: list[tuple[str, str, str, Callable[[Any], float | None]]] = [
            (RUNNING, "{sequence}", "Sequences running in the engine", lambda s: s.num_running),
            (WAITING, "{sequence}", "Sequences waiting in the engine", lambda s: s.num_waiting),
            (KV_USAGE, "1", "Fraction of KV-cache blocks in use", _kv_usage),
            (KV_BLOCKS_USED, "{block}", "KV-cache blocks in use", lambda s: s.kv_blocks_used),
        ]
        for name, unit, desc, read in gauges:
            meter.create_observable_gauge(
                name, callbacks=[self._stats_callback(read)], unit=unit, description=desc
            )
        counters: list[tuple[str, str, str, str]] = [
            (STEPS, "{step}", "Engine steps", "steps"),
            (TOKENS_GENERATED, "{token}", "Tokens generated (accepted drafts included)",
             "generated_tokens"),
            (PREEMPTIONS, "{preemption}", "Sequences preempted", "preemptions_total"),
            (CACHED_PROMPT_TOKENS, "{token}", "Prompt tokens served from the prefix cache",
             "cached_prompt_tokens"),
            (COMPUTED_PROMPT_TOKENS, "{token}", "Prompt tokens computed (prefill)",
             "computed_prompt_tokens"),
            (ISOLATED_RUNS, "{run}", "Suspect jobs run apart from the normal batch: cohorts "
             "after a worker died, groups bisected after a failed step", "isolated_runs"),
        ]  # fmt: skip
        for name, unit, desc, attr in counters:
            meter.create_observable_counter(
                name, callbacks=[self._counter_callback(attr)], unit=unit, description=desc
            )
        meter.create_observable_gauge(
            QUEUE_DEPTH,
            callbacks=[self._queue_callback(0)],
            unit="{entry}",
            description="Stream entries not yet delivered to any worker",
        )
        meter.create_observable_gauge(
            QUEUE_PENDING,
            callbacks=[self._queue_callback(1)],
            unit="{entry}",
            description="Stream entries delivered to a worker and not yet acknowledged",
        )
        self.jobs_finished = meter.create_counter(
            JOBS_FINISHED, unit="{job}", description="Jobs whose result was written"
        )

        def seconds_histogram(name: str, description: str, buckets: Any) -> metrics.Histogram:
            return meter.create_histogram(name, unit="s", description=description,
                                          explicit_bucket_boundaries_advisory=buckets)

        self.queue_time = seconds_histogram(
            QUEUE_TIME, "Enqueue to first scheduled by the engine", LATENCY_BUCKETS)
        self.ttft = seconds_histogram(
            TIME_TO_FIRST_TOKEN, "Enqueue to first generated token", LATENCY_BUCKETS)
        self.tpot = seconds_histogram(
            TIME_PER_OUTPUT_TOKEN, "Decode time per output token after the first", TPOT_BUCKETS)
        self.e2e = seconds_histogram(E2E_LATENCY, "Enqueue to result committed", LATENCY_BUCKETS)

    # -- sources -----------------------------------------------------------------------------
    def attach(
        self, worker_id: str, source: EngineSource, queue_depth: QueueDepthFn | None = None
    ) -> None:
        """Report ``source`` (an engine loop) under ``inflight.worker=worker_id``; with
        ``queue_depth``, also the depth of the job streams."""
        with self._lock:
            self._attached[worker_id] = _Attached(source, queue_depth)

    def detach(self, worker_id: str) -> None:
        """Stop reporting this worker."""
        with self._lock:
            self._attached.pop(worker_id, None)

    def _snapshot(self) -> list[tuple[str, _Attached]]:
        with self._lock:
            return list(self._attached.items())

    def _stats_callback(
        self, read: Callable[[Any], float | None]
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(_: CallbackOptions) -> Iterable[Observation]:
            out = []
            for worker_id, a in self._snapshot():
                stats = a.source.last_stats
                value = read(stats) if stats is not None else None
                if value is not None:
                    out.append(Observation(value, {"inflight.worker": worker_id}))
            return out

        return callback

    def _counter_callback(self, attr: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(_: CallbackOptions) -> Iterable[Observation]:
            return [
                Observation(getattr(a.source, attr), {"inflight.worker": worker_id})
                for worker_id, a in self._snapshot()
            ]

        return callback

    def _queue_callback(self, index: int) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(_: CallbackOptions) -> Iterable[Observation]:
            seen: dict[str, int] = {}
            for _worker_id, a in self._snapshot():
                if a.queue_depth is None:
                    continue
                try:
                    depths = a.queue_depth()
                except Exception as exc:  # Redis away: skip this collection
                    log.debug("queue depth unavailable: %s", exc)
                    continue
                for stream, values in depths.items():
                    seen.setdefault(stream, values[index])
            return [Observation(v, {"inflight.queue.stream": s}) for s, v in seen.items()]

        return callback

    # -- jobs (writer thread) ------------------------------------------------------------------
    def record_jobs(self, timelines: Iterable[JobTimeline], *, written_at: float) -> None:
        """Count the jobs and record their latencies; their results were committed at
        ``written_at``."""
        for t in timelines:
            attrs = {"inflight.queue.class": t.queue_class, "inflight.job.status": t.status}
            self.jobs_finished.add(1, attrs)
            if t.status != "succeeded":
                continue
            start = t.start
            if t.first_scheduled is not None:
                self.queue_time.record(max(0.0, t.first_scheduled - start), attrs)
            if t.first_token is not None:
                self.ttft.record(max(0.0, t.first_token - start), attrs)
                n = (t.completion_tokens or 0) - 1
                if n > 0 and t.finished is not None:
                    self.tpot.record(max(0.0, t.finished - t.first_token) / n, attrs)
            self.e2e.record(max(0.0, written_at - start), attrs)


def _kv_usage(stats: Any) -> float | None:
    total = stats.kv_blocks_total
    return stats.kv_blocks_used / total if total else None


def worker_metrics() -> WorkerMetrics | None:
    """The worker instruments on the configured meter provider; None while metrics are off."""
    state = current()
    if state.meter_provider is None:
        return None
    with _CREATE_LOCK:
        found = state.cache.get("worker_metrics")
        if found is None:
            found = state.cache["worker_metrics"] = WorkerMetrics(get_meter())
    return found


_CREATE_LOCK = threading.Lock()
