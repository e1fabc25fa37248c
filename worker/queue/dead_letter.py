"""Dead letters: an entry delivered too often goes to the dead stream and its job fails."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

import redis
from sqlalchemy.orm import Session, sessionmaker

from worker.queue.consumer import ack
from worker.queue.delivery import Delivery
from worker.queue.keys import QueueKeys
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
) -> list[str]:
    """Move entries to the dead-letter stream, fail their jobs with ``reason`` (committed),
    then ack them. Returns the failed job ids. Nothing is acked if the SQL write fails."""
    if not deliveries:
        return []
    pipe = redis_client.pipeline(transaction=False)
    for d in deliveries:
        fields = dict(d.fields or {})
        fields.update(
            {
                "dead_reason": reason if d.error is None else f"{reason}; {d.error}",
                "dead_stream": d.stream,
                "dead_entry_id": d.entry_id,
                "dead_deliveries": str(d.deliveries),
            }
        )
        pipe.xadd(keys.dead, fields)  # type: ignore[arg-type]
    pipe.execute()
    failed: list[str] = []
    with session_factory.begin() as session:
        for d in deliveries:
            job_id = d.job_id
            if job_id is None:
                continue
            message = f"dead-lettered: {reason} (delivered {d.deliveries} times)"
            if d.error:
                message += f"; {d.error}"
            if fail_job(session=session, job_id=job_id, error=message):
                failed.append(job_id)
    ack(redis_client=redis_client, keys=keys, entries=[(d.stream, d.entry_id) for d in deliveries])
    log.warning("dead-lettered %d entries: %s", len(deliveries), json.dumps(failed))
    return failed
