"""Dead-lettering: the job is failed in SQL (committed first), then its entry moves to
the dead-letter stream."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence

import redis
from sqlalchemy.orm import Session, sessionmaker

from worker.queue.dead_letter import move_to_dead
from worker.queue.delivery import Delivery
from worker.queue.keys import QueueKeys
from worker.store.crud import job_status

log = logging.getLogger(__name__)


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
            if d.job_id is None:
                continue
            message = f"dead-lettered: {reason} (delivered {d.deliveries} times)"
            for extra in (d.error, evidence.get((d.stream, d.entry_id))):
                if extra:
                    message += f"; {extra}"
            if job_status.fail_job(session=session, job_id=d.job_id, error=message):
                failed.append(d.job_id)
    move_to_dead(
        redis_client=redis_client, keys=keys, deliveries=deliveries, reason=reason,
        evidence=evidence,
    )
    log.warning("dead-lettered %d entries: %s", len(deliveries), json.dumps(failed))
    return failed
