"""Groups of suspect jobs that run with nothing else in the engine.

Two sources feed it: the intake's cohorts of one (a job redelivered after worker deaths
that evidence narrowed down to itself), and the engine loop's bisection after a failed
step (each half of the failed batch, halved again while it fails). The loop admits the
next group only once the engine is empty, and nothing else while a group runs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from worker.service.held_jobs import HeldJob


class Isolation:
    """The waiting groups and the running one. Not locked: the engine loop guards it with
    its own lock."""

    def __init__(self) -> None:
        self.waiting: deque[list[HeldJob]] = deque()
        self.running: set[str] = set()

    def busy(self) -> bool:
        """True while a group waits to run alone or runs alone."""
        return bool(self.waiting) or bool(self.running)

    def queue(self, group: list[HeldJob]) -> None:
        """Run ``group`` alone after the groups already waiting."""
        self.waiting.append(list(group))

    def bisect(self, failed: list[HeldJob], *, why: str) -> None:
        """Halve a failed batch (two or more jobs); both halves run next, alone, first half
        first. ``why`` (which step failed, and how) is kept on each job."""
        half = (len(failed) + 1) // 2
        groups = [failed[:half], failed[half:]]
        for group in groups:
            for held in group:
                held.isolation = f"{why}; re-run in an isolated group of {len(group)}"
        self.waiting.extendleft(reversed(groups))

    def next_group(self, active: Iterable[str], *, engine_empty: bool) -> list[HeldJob]:
        """The group to admit now (empty: none). ``active`` are the job ids in the engine;
        the running group ends when none of its jobs is left there."""
        self.running &= set(active)
        if self.running or not engine_empty or not self.waiting:
            return []
        return self.waiting.popleft()

    def started(self, job_ids: Iterable[str]) -> None:
        """The jobs of the admitted group that made it into the engine."""
        self.running = set(job_ids)

    def take_all(self) -> list[HeldJob]:
        """Every waiting job, forgetting the groups (drain, or the engine broke)."""
        left = [h for group in self.waiting for h in group]
        self.waiting.clear()
        self.running = set()
        return left
