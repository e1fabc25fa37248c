"""The one transition table of a job's status, and the sets every status write uses.

    queued  -> running                      a worker picks it up
    running -> running                      a worker picks up a redelivery of it
    running -> queued                       handed back unfinished (drain, broken engine)
    queued | running -> succeeded | failed  its result is written (failed: also refused,
                                            dead-lettered, or its worker failed it)
    queued | running -> cancelled           cancelled (at once when queued, by its worker
                                            or at its next pick-up when running)

The last three are terminal: nothing leaves them, so a late or repeated write never changes
an ended job. Every UPDATE of ``jobs.status`` (``worker/store/crud``) takes its allowed
starting statuses from :func:`sources`; the fault tests record every status write with a
trigger and check each against :func:`is_allowed`.
"""

from __future__ import annotations

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
