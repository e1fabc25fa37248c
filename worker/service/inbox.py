"""The worker's inbox: jobs delivered and held, not yet admitted to the engine. The intake
thread puts, the engine loop takes; the inbox alone owns the buffer and its lock, so no
thread ever iterates over it while another changes it."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Collection, Iterable

from worker.service.held_jobs import HeldJob


class Inbox:
    """A thread-safe FIFO of held jobs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: deque[HeldJob] = deque()

    def put(self, jobs: Iterable[HeldJob]) -> None:
        """Append jobs (intake)."""
        with self._lock:
            self._jobs.extend(jobs)

    def take(self, n: int) -> list[HeldJob]:
        """Remove and return up to ``n`` jobs, oldest first."""
        with self._lock:
            return [self._jobs.popleft() for _ in range(min(n, len(self._jobs)))]

    def take_ids(self, job_ids: Collection[str]) -> list[HeldJob]:
        """Remove and return the waiting jobs with these ids (cancelled before admission)."""
        with self._lock:
            found = [h for h in self._jobs if h.job_id in job_ids]
            if found:
                self._jobs = deque(h for h in self._jobs if h.job_id not in job_ids)
            return found

    def take_all(self) -> list[HeldJob]:
        """Remove and return every waiting job (drain, hand back)."""
        with self._lock:
            jobs = list(self._jobs)
            self._jobs.clear()
            return jobs

    def __len__(self) -> int:
        with self._lock:
            return len(self._jobs)
