"""What the threads of one worker share, in one object built once by ``WorkerProcess``
(``connect``) and kept by each thread as ``self.rt``: configuration and identity, the two
connections, the stop flags, the held-jobs registry, and the one inbox with the events
that pace it.

    intake  --(inbox.put, work_ready)-->  engine loop  --(want_changed)-->  intake
    engine loop --(writer queue)--> writer;  maintenance --(cancels)--> engine loop
    intake --(intake_stopped)--> engine loop (a drain takes the inbox back after it)

The engine loop is the only reader of the inbox and the only user of the engine; the
writer is the only thread that acks. Nothing here is global: two workers in one process
(tests) each have their own runtime.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Protocol

import redis
from sqlalchemy.orm import Session, sessionmaker

from worker.queue.keys import QueueKeys
from worker.service.config import WorkerConfig
from worker.service.held_jobs import HeldJob, Registry
from worker.service.inbox import Inbox
from worker.service.process_control import Flags


@dataclass
class WorkerRuntime:
    """The shared state of one worker run."""

    config: WorkerConfig
    worker_id: str  # this run's row in the workers table
    consumer: str  # this worker's consumer name in the stream group
    lock_token: str  # proves this process holds the consumer name (naming.py)
    keys: QueueKeys
    redis: redis.Redis
    session_factory: sessionmaker[Session]
    flags: Flags
    registry: Registry = field(default_factory=Registry)  # delivered, not yet acked
    inbox: Inbox = field(default_factory=Inbox)  # delivered, not yet admitted
    work_ready: threading.Event = field(default_factory=threading.Event)  # inbox or cancels
    want_changed: threading.Event = field(default_factory=threading.Event)  # room changed
    # set once the intake stopped reading: nothing is put in the inbox after it
    intake_stopped: threading.Event = field(default_factory=threading.Event)


class LoopDesk(Protocol):
    """What the intake asks of the engine loop (the loop's side of the inbox)."""

    def want(self) -> int:
        """How many more jobs to read now."""
        ...

    def want_interactive(self) -> int:
        """How many interactive jobs to read now, even when ``want()`` is 0."""
        ...

    def work_totals(self) -> tuple[float, float]:
        """Running totals for the measured rate: the estimated work of the jobs whose
        engine output ended, and the engine's seconds in steps."""
        ...

    def add_cohort(self, held: list[HeldJob], *, alone: bool) -> None:
        """Run a cohort of suspects, ``alone`` or beside the batch."""
        ...

    def isolation_busy(self) -> bool:
        """True while a group waits to run alone or runs alone."""
        ...
