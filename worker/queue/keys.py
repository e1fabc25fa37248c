"""Names of every Redis key the service uses, under one prefix."""

from __future__ import annotations

from dataclasses import dataclass

QUEUE_CLASSES = ("interactive", "batch")  # read in this order


@dataclass(frozen=True)
class QueueKeys:
    """Key names under ``prefix`` (tests use a unique prefix each)."""

    prefix: str = "inflight"
    group: str = "workers"

    def stream(self, queue_class: str) -> str:
        """The job stream of one class (``interactive`` or ``batch``)."""
        if queue_class not in QUEUE_CLASSES:
            raise ValueError(f"queue class {queue_class!r}: expected one of {QUEUE_CLASSES}")
        return f"{self.prefix}:jobs:{queue_class}"

    @property
    def streams(self) -> list[str]:
        """All job streams, interactive first."""
        return [self.stream(c) for c in QUEUE_CLASSES]

    @property
    def dead(self) -> str:
        """The dead-letter stream."""
        return f"{self.prefix}:jobs:dead"

    @property
    def suspects(self) -> str:
        """Hash of evidence against redelivered entries (see ``worker.queue.suspects``)."""
        return f"{self.prefix}:suspects"

    @property
    def cancels(self) -> str:
        """Set of job ids whose cancellation a worker must carry out."""
        return f"{self.prefix}:cancels"

    @property
    def carried(self) -> str:
        """Hash job id -> the stream entry carrying it (see ``worker.queue.carried``)."""
        return f"{self.prefix}:carried"

    @property
    def carried_ready(self) -> str:
        """Set once ``carried`` was built from the streams: from then on it is complete."""
        return f"{self.prefix}:carried:ready"

    def deltas(self, job_id: str) -> str:
        """The events stream of one job that someone waits on: its text deltas as the
        worker produces them (streamed jobs) and its end (``worker.queue.job_events``)."""
        return f"{self.prefix}:job:deltas:{job_id}"

    @property
    def reconcile_lock(self) -> str:
        """Lock so only one reconciler runs at a time."""
        return f"{self.prefix}:lock:reconcile"

    def consumer_lock(self, consumer: str) -> str:
        """Lock held by the live worker that uses consumer name ``consumer``."""
        return f"{self.prefix}:lock:consumer:{consumer}"

    def class_of(self, stream: str) -> str:
        """The queue class of a stream key."""
        return stream.rsplit(":", 1)[-1]
