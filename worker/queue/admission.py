"""Backpressure: whether a queue can take more jobs now, checked before anything is written.

Two reasons to refuse: Redis refuses writes (out of memory under ``noeviction``, a read-only
replica, unreachable), or the queue is deeper than a configured bound (the interactive
stream; for batch work, the model's lanes together). The write probe is a
tiny expiring key, so a Redis that would refuse the XADD refuses the probe first and nothing
is committed to SQL for a job that could not be published."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, cast

import redis

from worker.queue.keys import QueueKeys

log = logging.getLogger(__name__)

RETRY_AFTER_FULL_S = 10
RETRY_AFTER_DOWN_S = 5


class QueueRefused(Exception):
    """The queue cannot take jobs now. ``full``: over its bound (else Redis refuses writes);
    ``retry_after``: seconds after which a retry may succeed."""

    def __init__(self, message: str, *, full: bool, retry_after: int) -> None:
        super().__init__(message)
        self.full = full
        self.retry_after = retry_after


def redis_refusal(exc: redis.RedisError) -> QueueRefused:
    """The refusal for a failed Redis write: Redis's own reason when it answered (OOM,
    READONLY, MISCONF ...); the error's kind only when it could not be reached, since that
    text names the server's address (logged here for the operator, never answered)."""
    if isinstance(exc, redis.ResponseError):
        reason = str(exc).splitlines()[0].split("caused error: ")[-1].rstrip(".")
        message = f"the queue refuses writes ({type(exc).__name__}: {reason})"
    else:  # connection refused, timeout
        log.warning("queue unreachable: %s", exc)
        message = f"the queue is unreachable ({type(exc).__name__})"
    return QueueRefused(message, full=False, retry_after=RETRY_AFTER_DOWN_S)


@dataclass
class Admission:
    """How many of the offered jobs the queue takes now (``room`` >= 1 when admitted)."""

    room: int


def admit(
    *, redis_client: redis.Redis, keys: QueueKeys, queue_class: str, offered: int, max_depth: int
) -> Admission:
    """Admit up to ``offered`` jobs to ``queue_class``'s queue of ``keys.model``
    (``max_depth`` 0: no bound); raises QueueRefused when none can go in now. The probe is in
    the streams' hash slot, so on a cluster it asks the node that would take the XADD."""
    try:
        depth = _depth(redis_client, keys, queue_class)
    except redis.RedisError as exc:
        raise redis_refusal(exc) from exc
    if not max_depth:
        return Admission(room=offered)
    room = max_depth - int(depth)
    if room <= 0 and offered > 0:
        raise QueueRefused(
            f"the {queue_class} queue of model {keys.model!r} holds {depth} entries, at its "
            f"bound of {max_depth}",
            full=True,
            retry_after=RETRY_AFTER_FULL_S,
        )
    return Admission(room=min(offered, max(room, 0)))


def _depth(redis_client: redis.Redis, keys: QueueKeys, queue_class: str) -> int:
    """Write the probe, then the entries of the class's streams (XLEN of the interactive
    stream, or of every lane)."""
    pipe = cast(Any, redis_client).pipeline(transaction=False)
    pipe.set(keys.admission_probe, "1", px=5000)
    if queue_class != "batch":
        pipe.xlen(keys.stream(queue_class))
        return int(pipe.execute()[1])
    pipe.zrange(keys.lanes, 0, -1)
    lanes = pipe.execute()[1]
    if not lanes:
        return 0
    pipe = cast(Any, redis_client).pipeline(transaction=False)
    for lane in lanes:
        pipe.xlen(lane)
    return sum(int(n) for n in pipe.execute())
