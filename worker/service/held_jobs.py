"""Registry of the jobs this worker holds (read from Redis, not yet acked)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from worker.queue.delivery import Delivery


@dataclass
class HeldJob:
    """A job between its delivery and its ack."""

    job_id: str
    stream: str
    entry_id: str
    delivery: Delivery
    received: float = field(default_factory=time.time)
    isolation: str | None = None  # why it runs isolated (kept with its result)
    # structured output, compiled by the intake (worker.service.grammars): the compiled
    # grammar for engine.add_request, or why the job fails without reaching the engine
    grammar: Any = None
    grammar_error: str | None = None
    # its share of the wall time of the engine steps it computed in (loop_output.charge)
    engine_seconds: float = 0.0
    work: int = 0  # its estimated work (worker.protocol.work_estimate), for the measured rate

    @property
    def service_class(self) -> str:
        """``interactive`` or ``batch``: the class of the stream it came from."""
        return "interactive" if self.stream.endswith(":interactive") else "batch"


class Registry:
    """Thread-safe map job id -> HeldJob (intake adds, writer removes after the ack)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, HeldJob] = {}

    def add(self, job: HeldJob) -> bool:
        """Hold ``job``; False if this job id is already held (a duplicate delivery)."""
        with self._lock:
            if job.job_id in self._jobs:
                return False
            self._jobs[job.job_id] = job
            return True

    def get(self, job_id: str) -> HeldJob | None:
        """The held job with this id."""
        with self._lock:
            return self._jobs.get(job_id)

    def remove(self, job_ids: list[str]) -> None:
        """Forget jobs that were acked or let go."""
        with self._lock:
            for j in job_ids:
                self._jobs.pop(j, None)

    def entries(self) -> list[tuple[str, str]]:
        """(stream, entry id) of every held job."""
        with self._lock:
            return [(j.stream, j.entry_id) for j in self._jobs.values()]

    def holds_any(self, job_ids: set[str]) -> bool:
        """True while any of these jobs is still held (not yet acked or let go)."""
        with self._lock:
            return any(j in self._jobs for j in job_ids)

    def job_ids(self) -> list[str]:
        """Ids of every held job."""
        with self._lock:
            return list(self._jobs)

    def __len__(self) -> int:
        with self._lock:
            return len(self._jobs)
