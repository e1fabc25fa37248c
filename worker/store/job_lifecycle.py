"""The one transition table of a job's status, and the named moves every status write makes.

    queued  -> running                      a worker picks it up
    running -> running                      a worker picks up a redelivery of it
    running -> queued                       handed back unfinished (drain, broken engine)
    queued | running -> succeeded | failed  its result is written (failed: also refused,
                                            dead-lettered, or its worker failed it)
    queued | running -> cancelled           cancelled (at once when queued, by its worker
                                            or at its next pick-up when running)

The last three are terminal: nothing leaves them, so a late or repeated write never changes
an ended job.

:data:`MOVES` names each move a status write makes (start, finish, hand back, ...) with
the statuses it starts from and ends in, every one an edge of :data:`TRANSITIONS`. The
writes themselves (``worker/store/crud/job_status.py``) are made only by ``worker/jobs``,
and each takes its ``WHERE status IN (...)`` from its move's :attr:`Move.sources`; the fault
tests record every status write with a trigger and check each against :func:`is_allowed`.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.store.models.job import JobStatus

Q, R = JobStatus.QUEUED.value, JobStatus.RUNNING.value
S, F, C = JobStatus.SUCCEEDED.value, JobStatus.FAILED.value, JobStatus.CANCELLED.value

TRANSITIONS: dict[str, frozenset[str]] = {
    Q: frozenset({R, S, F, C}),
    R: frozenset({R, Q, S, F, C}),
    S: frozenset(),
    F: frozenset(),
    C: frozenset(),
}

TERMINAL: tuple[str, ...] = tuple(s for s, nxt in TRANSITIONS.items() if not nxt)
OPEN: tuple[str, ...] = tuple(s for s, nxt in TRANSITIONS.items() if nxt)


def sources(target: str) -> tuple[str, ...]:
    """The statuses a job may be in for a write to move it to ``target``."""
    return tuple(s for s, nxt in TRANSITIONS.items() if target in nxt)


def is_allowed(old: str, new: str) -> bool:
    """True when a job may go from ``old`` to ``new``."""
    return new in TRANSITIONS.get(old, frozenset())


HELD: tuple[str, ...] = sources(Q)
"""The statuses of a job a worker holds: those it can be handed back from (running)."""


@dataclass(frozen=True)
class Move:
    """One status write: the statuses a job must be in for it to apply (``sources``, the
    write's ``WHERE``) and those it may leave the job in (``targets``)."""

    name: str
    sources: tuple[str, ...]
    targets: tuple[str, ...]


def _move(name: str, targets: tuple[str, ...], *, held: bool | None = None) -> Move:
    """The move to ``targets`` from every status the table allows each of them from;
    ``held``: only from the statuses of a job a worker holds (True) or only the others."""
    allowed = [s for s in TRANSITIONS if all(is_allowed(s, t) for t in targets)]
    if held is not None:
        allowed = [s for s in allowed if (s in HELD) == held]
    return Move(name, tuple(allowed), targets)


START = _move("start", (R,))
"""A worker picks a job up (or a redelivery of one it may run again)."""
START_CANCELLED = _move("start of a job whose cancel is recorded", (C,))
"""A job picked up with a recorded cancel ends at once instead: the durable cancel wins."""
FINISH = _move("finish", TERMINAL)
"""A worker writes a job's result: succeeded, failed, or cancelled by its worker."""
FAIL = _move("fail", (F,))
"""A job fails without a result of its own (dead-lettered)."""
CANCEL = _move("cancel", (C,), held=False)
"""A cancel ends a job at once only where no worker holds it."""
RECORD_CANCEL = _move("cancel of a held job", HELD, held=True)
"""A cancel of a job a worker holds is recorded (``cancel_requested_at``), its status kept;
its worker ends it, or the next start after it was handed back."""
HAND_BACK = _move("hand back", (Q, C), held=True)
"""A worker gives a job it will not finish back to the queue; one whose cancel was
recorded ends cancelled instead."""

MOVES: tuple[Move, ...] = (START, START_CANCELLED, FINISH, FAIL, CANCEL, RECORD_CANCEL, HAND_BACK)
"""Every move a status UPDATE makes (a job is created ``queued`` by its INSERT)."""
