"""Start: the jobs a worker was delivered are marked running in SQL before it runs them;
their stream entries stay pending in Redis (held, kept alive) until :mod:`worker.jobs.finish`
acks them or :mod:`worker.jobs.hand_back` gives them back."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session, sessionmaker

from worker.store.crud import job_status


def start(
    *, session_factory: sessionmaker[Session], job_ids: Sequence[str], worker_id: str
) -> set[str]:
    """Mark the jobs running on ``worker_id`` (committed) and return those that may run.
    A job already ended is left out (its entry is only acked), and one whose cancel was
    recorded ends ``cancelled`` instead of running."""
    with session_factory.begin() as session:
        return job_status.start_jobs(session=session, job_ids=job_ids, worker_id=worker_id)
