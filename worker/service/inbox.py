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

    def take(self, n: int, *, interactive_only: bool = False) -> list[HeldJob]:
        """Remove and return up to ``n`` jobs, interactive ones first, each class oldest
        first (``interactive_only``: no batch job)."""
        n = max(0, n)
        with self._lock:
            interactive = [h for h in self._jobs if h.service_class == "interactive"]
            taken = interactive[:n]
            if not interactive_only:
                taken += [h for h in self._jobs if h.service_class != "interactive"][:n - len(taken)]
            if taken:
                ids = {id(h) for h in taken}
                self._jobs = deque(h for h in self._jobs if id(h) not in ids)
            return taken

    def num_interactive(self) -> int:
        """Interactive jobs waiting here."""
        with self._lock:
            return sum(1 for h in self._jobs if h.service_class == "interactive")

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
