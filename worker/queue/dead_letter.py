"""Dead letters: an entry delivered too often goes to the dead stream and its job fails."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence

import redis
from sqlalchemy.orm import Session, sessionmaker

from worker.queue.delivery import Delivery
from worker.queue.keys import QueueKeys
from worker.queue.suspects import field_of
from worker.store.crud.jobs import fail_job

log = logging.getLogger(__name__)


def over_limit(delivery: Delivery, *, max_deliveries: int) -> bool:
    """True when the entry has been delivered more than ``max_deliveries`` times."""
    return delivery.deliveries > max_deliveries


def dead_letter(
    *,
    redis_client: redis.Redis,
    session_factory: sessionmaker[Session],
    keys: QueueKeys,
    deliveries: Sequence[Delivery],
    reason: str,
    evidence: Mapping[tuple[str, str], str] | None = None,
) -> list[str]:
    """Fail the entries' jobs with ``reason`` (committed first), then move the entries to
    the dead-letter stream and ack them in one Redis transaction. Returns the job ids this
    call failed. Nothing is acked if the SQL write fails, and a retry after a Redis failure
    neither fails a job twice (the write is conditional on the job being open) nor writes
    a dead entry twice (XADD and XACK commit together). ``evidence`` adds a line per entry
    (``(stream, entry_id)`` -> text) to its job's error and its dead entry."""
    evidence = evidence or {}
    if not deliveries:
        return []
    failed: list[str] = []
    with session_factory.begin() as session:
        for d in deliveries:
            job_id = d.job_id
            if job_id is None:
                continue
            message = f"dead-lettered: {reason} (delivered {d.deliveries} times)"
            for extra in (d.error, evidence.get((d.stream, d.entry_id))):
                if extra:
                    message += f"; {extra}"
            if fail_job(session=session, job_id=job_id, error=message):
                failed.append(job_id)
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
        pipe.xadd(keys.dead, fields)  # type: ignore[arg-type]
        pipe.xack(d.stream, keys.group, d.entry_id)
        pipe.hdel(keys.suspects, field_of(d.stream, d.entry_id))
    pipe.execute()
    log.warning("dead-lettered %d entries: %s", len(deliveries), json.dumps(failed))
    return failed
