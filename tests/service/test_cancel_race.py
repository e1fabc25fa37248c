"""A cancel racing a hand-back (real PostgreSQL and Redis): a running job that its worker
hands back (running -> queued) while a cancel is being recorded must still never run. The
cancel used to select queued jobs in one statement and running ones in the next; a job
handed back in between matched neither and ran. Now one statement meets each open job
once: the hand-back waits for it, and the job ends ``cancelled`` when it is handed back
(flagged) or at once (queued); a start after that never runs it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import SimpleNamespace

import pytest
from sqlalchemy import event

from api.control.maintenance import cancel_batch_jobs
from worker.jobs.cancel import request_cancel
from worker.jobs.enqueue import enqueue
from worker.jobs.hand_back import hand_back_jobs
from worker.jobs.start import start
from worker.queue.consumer import read_new
from worker.queue.group import ensure_groups
from worker.store.crud.jobs import get_job
from worker.store.schemas import NewJob

pytestmark = pytest.mark.services

BATCH = "batch_race"


def _cancel_batch(sf, redis_client, keys, job_id: str) -> None:
    ctx = SimpleNamespace(session_factory=sf, redis=redis_client, keys=keys)
    cancel_batch_jobs(ctx, batch_id=BATCH)  # type: ignore[arg-type]


def _cancel_job(sf, redis_client, keys, job_id: str) -> None:
    request_cancel(session_factory=sf, redis_client=redis_client, keys=keys, job_id=job_id)


@pytest.mark.parametrize("cancel", [_cancel_batch, _cancel_job], ids=["batch", "one job"])
def test_a_job_handed_back_while_its_cancel_is_written_never_runs(
    session_factory, redis_client, keys, cancel: Callable[..., None]
) -> None:
    ensure_groups(redis_client=redis_client, keys=keys)
    jobs = [NewJob(request={"prompt": f"p{i}"}, batch_id=BATCH, custom_id=f"c{i}") for i in range(2)]
    enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys, jobs=jobs)
    (held,) = read_new(redis_client=redis_client, keys=keys, consumer="w1", count=1)
    assert held.job_id is not None
    running = held.job_id
    (queued,) = {j.id for j in jobs} - {running}
    assert start(session_factory=session_factory, job_ids=[running], worker_id="w1") == {running}

    # The hand-back lands right after the cancel's first statement on jobs (it waits for
    # that statement's row locks, if it holds any, up to a second; then the cancel goes on).
    engine = session_factory.kw["bind"]
    armed = threading.Event()
    armed.set()
    handing: list[threading.Thread] = []

    def hand_back() -> None:
        hand_back_jobs(session_factory=session_factory, redis_client=redis_client, keys=keys,
                       worker_id="w1", deliveries=[held], uncount=True)

    def between(conn, cursor, statement: str, *args) -> None:
        if armed.is_set() and statement.lstrip().upper().startswith("UPDATE JOBS"):
            armed.clear()
            thread = threading.Thread(target=hand_back, daemon=True)
            handing.append(thread)
            thread.start()
            thread.join(1.0)

    event.listen(engine, "after_cursor_execute", between)
    try:
        cancel(session_factory, redis_client, keys, running)
    finally:
        event.remove(engine, "after_cursor_execute", between)
    assert handing, "the cancel wrote nothing to jobs"
    handing[0].join(10)
    assert not handing[0].is_alive()

    with session_factory() as s:
        job = get_job(session=s, job_id=running)
        assert job is not None and job.status in ("queued", "cancelled")
        assert job.status == "cancelled" or job.cancel_requested_at is not None, "neither cancelled nor flagged"
    # another worker picks the re-published entry up: the job must not run
    assert start(session_factory=session_factory, job_ids=[running], worker_id="w2") == set()
    with session_factory() as s:
        assert get_job(session=s, job_id=running).status == "cancelled"  # type: ignore[union-attr]
        if cancel is _cancel_batch:
            assert get_job(session=s, job_id=queued).status == "cancelled"  # type: ignore[union-attr]
