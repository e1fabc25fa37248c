"""Each status write of the store against a job in every status: it moves the job only
from its move's sources (``worker.store.job_lifecycle.MOVES``) and only to its targets, and
leaves every other job as it was (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from worker.store.base import utcnow
from worker.store.crud import job_status
from worker.store.crud.jobs import get_job
from worker.store.db import make_engine, make_session_factory
from worker.store.job_lifecycle import (
    CANCEL,
    FAIL,
    FINISH,
    HAND_BACK,
    RECORD_CANCEL,
    START,
    START_CANCELLED,
    TRANSITIONS,
    Move,
)
from worker.store.models import Job
from worker.store.schemas import JobResult, NewJob

pytestmark = pytest.mark.services

WRITES: dict[str, tuple[Callable[[Session, str], object], tuple[Move, ...], bool]] = {
    # name: (the write, the moves it makes, whether the job carries a recorded cancel)
    "start": (lambda s, j: job_status.start_jobs(session=s, job_ids=[j], worker_id="w"),
              (START,), False),
    "start, cancel recorded": (
        lambda s, j: job_status.start_jobs(session=s, job_ids=[j], worker_id="w"),
        (START_CANCELLED,), True),
    "finish": (lambda s, j: job_status.finish_jobs(
        session=s, results=[JobResult(job_id=j, status="succeeded", text="x")], worker_id="w"),
        (FINISH,), False),
    "fail": (lambda s, j: job_status.fail_job(session=s, job_id=j, error="e"), (FAIL,), False),
    "hand back": (lambda s, j: job_status.requeue_jobs(session=s, job_ids=[j], worker_id="w"),
                  (HAND_BACK,), False),
    "hand back, cancel recorded": (
        lambda s, j: job_status.requeue_jobs(session=s, job_ids=[j], worker_id="w"),
        (HAND_BACK,), True),
    "cancel": (lambda s, j: job_status.cancel_job(session=s, job_id=j),
               (CANCEL, RECORD_CANCEL), False),
    "cancel a batch": (lambda s, j: job_status.cancel_batch_jobs(session=s, batch_id="b"),
                       (CANCEL, RECORD_CANCEL), False),
    "cancel a batch's queued": (
        lambda s, j: job_status.cancel_queued_batch_jobs(session=s, batch_id="b"), (CANCEL,), False),
}


@pytest.fixture(params=["sqlite", "postgresql"])
def sf(request: pytest.FixtureRequest):
    url = request.getfixturevalue("migrated_sqlite" if request.param == "sqlite" else "migrated_pg")
    engine = make_engine(url=url)
    yield make_session_factory(engine=engine)
    engine.dispose()


@pytest.mark.parametrize("name", list(WRITES))
def test_each_write_moves_a_job_only_as_its_moves_allow(sf, name: str) -> None:
    write, moves, cancel_recorded = WRITES[name]
    for status in TRANSITIONS:
        with sf.begin() as s:
            job_id, bystander = job_status.create_jobs(
                session=s, jobs=[NewJob(request={"prompt": "p"}, batch_id="b"),
                                 NewJob(request={"prompt": "q"}, batch_id="other")])
            s.execute(update(Job).where(Job.id.in_([job_id, bystander])).values(
                status=status, worker_id="w",
                cancel_requested_at=utcnow() if cancel_recorded else None))
        with sf.begin() as s:
            write(s, job_id)
        with sf() as s:
            after = get_job(session=s, job_id=job_id)
            other = get_job(session=s, job_id=bystander)
        assert after is not None and other is not None
        assert other.status == status, f"{name} moved another batch's job"
        movers = [m for m in moves if status in m.sources]
        if not movers:
            assert after.status == status, f"{name} moved a {status} job to {after.status}"
            continue
        assert any(after.status in m.targets for m in movers), (name, status, after.status)
        if RECORD_CANCEL in movers:
            assert after.cancel_requested_at is not None
        if HAND_BACK in movers:  # queued again, unless its cancel was recorded: then ended
            assert after.status == ("cancelled" if cancel_recorded else "queued"), after.status
