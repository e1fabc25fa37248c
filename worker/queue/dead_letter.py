"""Dead letters on the Redis side: an entry delivered too often moves to the dead stream
(the job is failed in SQL first, :mod:`worker.jobs.dead_letter`).

The dead stream is capped: every XADD trims it to the newest ``INFLIGHT_DEAD_MAXLEN``
entries (default 100,000; 0 keeps everything). It is evidence for the operator, not the
record: the failed job and its reason stay in SQL."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import redis

from worker.queue.carried import forget
from worker.queue.delivery import Delivery
from worker.queue.keys import QueueKeys
from worker.queue.suspects import field_of

DEAD_MAXLEN_DEFAULT = 100_000


def dead_maxlen() -> int:
    """Entries the dead stream keeps: ``INFLIGHT_DEAD_MAXLEN``, else 100,000 (0: no cap)."""
    value = os.environ.get("INFLIGHT_DEAD_MAXLEN")
    return int(value) if value not in (None, "") else DEAD_MAXLEN_DEFAULT


def over_limit(delivery: Delivery, *, max_deliveries: int) -> bool:
    """True when the entry has been delivered more than ``max_deliveries`` times."""
    return delivery.deliveries > max_deliveries


def move_to_dead(
    *,
    redis_client: redis.Redis,
    keys: QueueKeys,
    deliveries: Sequence[Delivery],
    reason: str,
    evidence: Mapping[tuple[str, str], str],
    max_len: int | None = None,
) -> None:
    """Copy each entry (with why it died) to the dead-letter stream, ack it and drop its
    suspect record and its carrier field, all in one Redis transaction: a retry never
    writes a dead entry twice. The stream keeps its newest ``max_len`` entries (default
    :func:`dead_maxlen`; 0: all)."""
    cap = dead_maxlen() if max_len is None else max_len
    pipe = redis_client.pipeline(transaction=True)
    for d in deliveries:
        fields = dict(d.fields or {})
        fields.update(
            {
                "dead_reason": reason if d.error is None else f"{reason}; {d.error}",
                "dead_stream": d.stream,
                "dead_entry_id": d.entry_id,
                "dead_deliveries": str(d.deliveries),
                "dead_evidence": evidence.get((d.stream, d.entry_id), ""),
            }
        )
        pipe.xadd(
            keys.dead, fields, maxlen=cap or None, approximate=False  # type: ignore[arg-type]
        )
        pipe.xack(d.stream, keys.group, d.entry_id)
        pipe.hdel(keys.suspects, field_of(d.stream, d.entry_id))
    forget(redis_client, pipe, keys, [(d.stream, d.entry_id, d.job_id) for d in deliveries])
    pipe.execute()
