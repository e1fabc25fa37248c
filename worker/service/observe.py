"""The worker's telemetry hooks: job timelines noted by the engine loop, preemption events,
spans and latency metrics made by the output writer after a commit, engine gauges.

Everything here is skipped when telemetry is off (``JobObserver.enabled`` is False); the
engine loop itself only bumps a few integer counters per step either way.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from worker.queue.keys import QueueKeys
from worker.queue.stream_stats import stream_stats
from worker.service.held_jobs import HeldJob
from worker.store.base import from_epoch
from worker.store.schemas import JobResult
from worker.telemetry.job_spans import record_job_spans
from worker.telemetry.metrics import EngineSource, worker_metrics
from worker.telemetry.setup import get_tracer, tracing_enabled
from worker.telemetry.timeline import JobTimeline

log = logging.getLogger(__name__)


def entry_time(entry_id: str) -> float | None:
    """The XADD time (seconds) a Redis stream entry id carries; None if it is not one."""
    ms, _, _ = entry_id.partition("-")
    return int(ms) / 1000.0 if ms.isdigit() else None


class JobObserver:
    """Telemetry of one worker. Made with whatever ``configure_telemetry`` turned on."""

    def __init__(
        self, worker_id: str, *, redis_client: Any = None, keys: QueueKeys | None = None
    ) -> None:
        self.worker_id = worker_id
        self.tracing = tracing_enabled()
        self.metrics = worker_metrics()
        self.enabled = self.tracing or self.metrics is not None
        self._redis = redis_client
        self._keys = keys
        self._seen_preemptions: dict[str, int] = {}  # engine sequence id -> preemptions seen
        self._preemptions: dict[str, list[tuple[float, int]]] = {}  # job id -> (time, step)

    # -- metrics sources -------------------------------------------------------------------
    def attach(self, source: EngineSource) -> None:
        """Report the engine loop's counters and the queue depth (when metrics are on)."""
        if self.metrics is None:
            return
        depth = None
        if self._redis is not None and self._keys is not None:
            redis_client, keys = self._redis, self._keys

            def depth() -> dict[str, tuple[int, int]]:
                return {
                    s.stream: (s.length if s.lag is None else s.lag, s.pending or 0)
                    for s in stream_stats(redis_client=redis_client, keys=keys)
                }

        self.metrics.attach(self.worker_id, source, depth)

    def detach(self) -> None:
        """Stop reporting (the worker stops)."""
        if self.metrics is not None:
            self.metrics.detach(self.worker_id)

    # -- engine loop thread ------------------------------------------------------------------
    def note_preemptions(self, engine: Any, stats: Any) -> None:
        """After a step that preempted: note which jobs, for span events. Reads the engine's
        ``requests`` (sequence id -> sequence) only on such steps."""
        seqs = getattr(engine, "requests", None)
        if not isinstance(seqs, dict):
            return
        when = getattr(stats, "start_time", 0.0) or 0.0
        for key, seq in seqs.items():
            n = getattr(getattr(seq, "metrics", None), "num_preemptions", 0)
            if n > self._seen_preemptions.get(key, 0):
                self._seen_preemptions[key] = n
                job_id = str(getattr(seq, "group_id", None) or getattr(seq, "request_id", key))
                self._preemptions.setdefault(job_id, []).append((when, stats.step))

    def timeline(self, held: HeldJob, result: JobResult, metrics: Any = None) -> JobTimeline | None:
        """The job's timeline to hand to the writer with its result (None when off)."""
        if not self.enabled:
            return None
        msg = held.delivery.message
        t = JobTimeline(
            job_id=held.job_id,
            worker_id=self.worker_id,
            queue_class=held.service_class,
            received=held.received,
            traceparent=msg.traceparent if msg is not None else None,
            enqueued=entry_time(held.entry_id),
            tenant=msg.tenant if msg is not None else "default",
            priority=msg.priority if msg is not None else 0,
            attempt=msg.attempt if msg is not None else 0,
            deliveries=held.delivery.deliveries,
            status=result.status,
            finish_reason=result.finish_reason,
            error=result.error,
            prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
            first_step=result.first_step,
            last_step=result.last_step,
        )
        if metrics is not None:
            t.admitted = getattr(metrics, "arrival_time", None)
            t.first_scheduled = getattr(metrics, "first_scheduled_time", None)
            t.first_token = getattr(metrics, "first_token_time", None)
            t.finished = getattr(metrics, "finished_time", None)
            t.num_preemptions = getattr(metrics, "num_preemptions", 0) or 0
        if self._preemptions:
            t.preemptions = self._preemptions.pop(held.job_id, [])
        if self._seen_preemptions:
            prefix = held.job_id + "#"
            for key in [
                k for k in self._seen_preemptions if k == held.job_id or k.startswith(prefix)
            ]:
                del self._seen_preemptions[key]
        return t

    # -- writer thread -----------------------------------------------------------------------
    def written(self, timelines: list[JobTimeline], start: float, end: float) -> None:
        """Spans and latency metrics of jobs whose results one transaction committed."""
        if not timelines:
            return
        try:
            if self.tracing:
                record_job_spans(get_tracer(), timelines, write_start=start, write_end=end)
            if self.metrics is not None:
                self.metrics.record_jobs(timelines, written_at=end)
        except Exception:
            log.exception("telemetry for %d written jobs failed", len(timelines))


def trace_row(worker_id: str, s: Any) -> dict[str, Any]:
    """One engine step's statistics as a row of the ``iterations`` table."""
    return {
        "worker_id": worker_id,
        "step": s.step,
        "time": from_epoch(s.start_time or time.time()),
        "num_running": s.num_running,
        "num_waiting": s.num_waiting,
        "num_prefill_tokens": s.num_prefill_tokens,
        "num_decode_tokens": s.num_decode_tokens,
        "kv_blocks_used": s.kv_blocks_used,
        "kv_blocks_total": s.kv_blocks_total,
        "num_preemptions": s.num_preemptions,
        "num_admitted": s.num_admitted,
        "num_finished": s.num_finished,
        "schedule_ms": s.schedule_seconds * 1000.0,
        "forward_ms": s.forward_seconds * 1000.0,
        "sample_ms": s.sample_seconds * 1000.0,
        "num_running_interactive": getattr(s, "num_running_interactive", 0),
        "num_waiting_interactive": getattr(s, "num_waiting_interactive", 0),
        "num_interactive_tokens": getattr(s, "num_interactive_tokens", 0),
        "paused_ms": getattr(s, "paused_seconds", 0.0) * 1000.0,
    }
