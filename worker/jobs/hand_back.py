"""Hand-back: jobs a worker holds but will not finish (it drains, or its engine broke)
are requeued in SQL (committed first), then their entries are re-published as fresh ones."""

from __future__ import annotations

from collections.abc import Sequence

import redis
from sqlalchemy.orm import Session, sessionmaker

from worker.queue.delivery import Delivery
from worker.queue.keys import QueueKeys
from worker.queue.reissue import reissue_entries
from worker.store.crud import job_status


def hand_back_jobs(
    *,
    session_factory: sessionmaker[Session],
    redis_client: redis.Redis,
    keys: QueueKeys,
    worker_id: str,
    deliveries: Sequence[Delivery],
    uncount: bool,
) -> int:
    """Requeue the deliveries' jobs (those this worker still runs; ``uncount``: the attempt
    does not count against the job), then re-publish each entry and ack the old one.
    Returns how many entries moved. Safe to repeat after a failure at any point: the
    requeue is conditional on the job still running here, the re-publish on the old entry
    still pending."""
    job_ids = [d.job_id for d in deliveries if d.job_id is not None]
    with session_factory.begin() as session:
        job_status.requeue_jobs(session=session, job_ids=job_ids, worker_id=worker_id, uncount=uncount)
    return reissue_entries(redis_client=redis_client, keys=keys, deliveries=deliveries)
