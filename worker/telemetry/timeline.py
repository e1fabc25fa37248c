"""What the worker notes about one job for telemetry: plain timestamps, no spans."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class JobTimeline:
    """Times (``time.time()`` seconds) and facts of one job in this worker; None where the
    job never got there (failed validation, cancelled while waiting)."""

    job_id: str
    worker_id: str
    queue_class: str
    received: float
    traceparent: str | None = None
    enqueued: float | None = None  # the stream entry's XADD time
    tenant: str = "default"
    priority: int = 0
    attempt: int = 0
    deliveries: int = 1
    admitted: float | None = None  # handed to the engine
    first_scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None
    status: str = ""
    finish_reason: str | None = None
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    first_step: int | None = None
    last_step: int | None = None
    num_preemptions: int = 0
    preemptions: list[tuple[float, int]] = field(default_factory=list)  # (time, engine step)

    @property
    def start(self) -> float:
        """When the job's trace starts in this worker's view: its enqueue, else its receipt."""
        if self.enqueued is not None and self.enqueued <= self.received:
            return self.enqueued
        return self.received
