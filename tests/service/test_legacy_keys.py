"""Upgrading from the untagged keys (``<prefix>:jobs:<class>``, ...): what they hold moves
to the per-model keys with nothing lost and nothing run twice (``worker.jobs.legacy_keys``),
by hand and by a worker as it starts."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.service.conftest import REDIS_URL
from tests.service.helpers import batch_entries, prompt_jobs, wait_for, worker_thread
from worker.jobs.legacy_keys import move_legacy_keys
from worker.queue.message import JobMessage
from worker.store.crud.job_status import create_jobs, finish_jobs, start_jobs
from worker.store.crud.jobs import get_job
from worker.store.models import Job
from worker.store.schemas import JobResult, NewJob

pytestmark = pytest.mark.services


def _old_deployment(redis_client: Any, keys: Any, session_factory: Any,
                    jobs: list[NewJob]) -> list[tuple[str, str]]:
    """Rows as revision 0014 leaves an older deployment's (no model) and one entry per job
    in the old batch stream, with the old consumer group; returns (job id, entry id)."""
    for job in jobs:
        job.model = None
    with session_factory.begin() as s:
        ids = create_jobs(session=s, jobs=jobs)
    old = keys.legacy.streams[1]
    out = []
    for job_id, job in zip(ids, jobs, strict=True):
        entry = redis_client.xadd(old, JobMessage(job_id=job_id, body=job.request).encode())
        redis_client.hset(keys.legacy.carried, job_id, f"{old}|{entry}")
        out.append((job_id, entry))
    redis_client.xgroup_create(old, keys.group, id="0")
    return out


def _ids_in(redis_client: Any, stream: str) -> list[str]:
    return [f["job_id"] for _, f in redis_client.xrange(stream)]


def _batch_ids(redis_client: Any, keys: Any) -> list[str]:
    """The job ids the batch lanes of ``keys.model`` hold."""
    return [f["job_id"] for _, _, f in batch_entries(redis_client, keys)]


def test_old_entries_move_once_and_what_a_live_old_worker_holds_stays(
    session_factory, redis_client, keys
) -> None:
    from worker.queue.carried import carried_among
    from worker.queue.producer import publish

    entries = _old_deployment(redis_client, keys, session_factory, prompt_jobs(6))
    (queued, _), (stale, _), (held, _), (ended, _), (elsewhere, _), (copied, _) = entries
    old = keys.legacy.streams[1]
    got = redis_client.xreadgroup(keys.group, "old-dead", {old: ">"}, count=2)  # queued, stale
    redis_client.xack(old, keys.group, got[0][1][0][0])  # ... queued: acked by an old worker
    redis_client.xadd(old, JobMessage(job_id=queued, body={}).encode())  # ... and re-published
    redis_client.xclaim(old, keys.group, "old-dead", 0, [got[0][1][1][0]], idle=3_600_000,
                        justid=True)  # stale: its worker died an hour ago
    redis_client.xreadgroup(keys.group, "old-live", {old: ">"}, count=1)  # held, fresh
    with session_factory.begin() as s:
        start_jobs(session=s, job_ids=[stale, held, ended], worker_id="old")
        finish_jobs(session=s, results=[JobResult(job_id=ended, status="succeeded")],
                    worker_id="old")
        s.get(Job, elsewhere).model = "other-model"  # a row that names its model already
    # a reconciler that ran before the move published one job to the new stream already
    publish(redis_client=redis_client, keys=keys,
            messages=[("batch", JobMessage(job_id=copied, body={}))])
    redis_client.xadd(keys.legacy.dead, {"job_id": "job_dead", "dead_reason": "old"})
    redis_client.sadd(keys.legacy.cancels, "job_x")

    first = move_legacy_keys(session_factory=session_factory, redis_client=redis_client,
                             keys=keys, mover="legacy-mover:w", min_idle_ms=60_000)
    assert (first.moved, first.finished) == (3, False)  # queued, stale, elsewhere
    assert first.dropped == 2  # ended; copied (a new stream carries it already)
    assert sorted(_batch_ids(redis_client, keys)) == sorted([copied, queued, stale])  # once each
    assert _batch_ids(redis_client, keys.for_model("other-model")) == [elsewhere]
    assert carried_among(redis_client=redis_client, keys=keys,
                         job_ids=[queued, stale, copied]) == {queued, stale, copied}
    with session_factory() as s:
        assert get_job(session=s, job_id=queued).model == keys.model  # adopted
        assert get_job(session=s, job_id=elsewhere).model == "other-model"
    # the live old worker's entry is left with it (and queued's first entry, acked)
    assert _ids_in(redis_client, old) == [queued, held]
    assert redis_client.exists(keys.legacy.dead, keys.legacy.cancels) == 2

    again = move_legacy_keys(session_factory=session_factory, redis_client=redis_client,
                             keys=keys, mover="legacy-mover:w", min_idle_ms=60_000)
    assert (again.moved, again.dropped, again.finished) == (0, 0, False)  # nothing twice
    (entry_id,) = [e for e, f in redis_client.xrange(old) if f["job_id"] == held]
    redis_client.xack(old, keys.group, entry_id)  # the old worker wrote its result
    last = move_legacy_keys(session_factory=session_factory, redis_client=redis_client,
                            keys=keys, mover="legacy-mover:w", min_idle_ms=60_000)
    assert (last.dead, last.finished) == (1, True)
    assert _ids_in(redis_client, keys.dead) == ["job_dead"]
    legacy = keys.legacy
    assert redis_client.exists(*legacy.streams, legacy.dead, *legacy.others, legacy.cancels) == 0
    assert move_legacy_keys(session_factory=session_factory, redis_client=redis_client,
                            keys=keys, mover="legacy-mover:w", min_idle_ms=60_000).moved == 0


def test_a_worker_started_on_an_old_deployment_runs_every_job_once(
    migrated_pg, session_factory, redis_client, keys
) -> None:
    from worker.engine import EngineArgs, LLMEngine
    from worker.service.config import WorkerConfig

    entries = _old_deployment(redis_client, keys, session_factory, prompt_jobs(5))
    # one more, in the old interactive stream, never read by any group
    (extra,) = prompt_jobs(1, tag="inter", cls="interactive")
    extra.model = None
    with session_factory.begin() as s:
        (extra_id,) = create_jobs(session=s, jobs=[extra])
    redis_client.xadd(keys.legacy.streams[0],
                      JobMessage(job_id=extra_id, body=extra.request).encode())
    ids = [j for j, _ in entries] + [extra_id]
    config = WorkerConfig(database_url=migrated_pg, redis_url=REDIS_URL, model="tiny-llama",
                          prefix=keys.prefix, name="upgraded", heartbeat_interval=0.3,
                          reconcile_interval=3600)

    def engine(_config: WorkerConfig) -> Any:
        return LLMEngine(EngineArgs(model="tiny-llama", max_num_seqs=8, num_kv_blocks=64,
                                    max_model_len=256))

    def ended() -> bool:
        with session_factory() as s:
            return all(get_job(session=s, job_id=j).status == "succeeded" for j in ids)

    with worker_thread(config, engine):
        wait_for(ended, timeout=120, what="the old deployment's jobs to succeed")
    with session_factory() as s:
        rows = [get_job(session=s, job_id=j) for j in ids]
    assert all(r.attempts == 1 and r.model == "tiny-llama" for r in rows)  # each ran once
    assert {r.queue_class for r in rows} == {"batch", "interactive"}
    assert redis_client.exists(*keys.legacy.streams) == 0  # drained, then deleted


def test_nothing_to_move_on_a_cluster(session_factory, redis_cluster, keys) -> None:
    from worker.queue.connection import make_redis

    client = make_redis(url=redis_cluster.url)
    try:
        done = move_legacy_keys(session_factory=session_factory, redis_client=client,
                                keys=keys, mover="m", min_idle_ms=1)
        assert (done.moved, done.finished) == (0, False)
    finally:
        client.close()


def test_the_batch_stream_from_before_the_lanes_moves_into_them(
    session_factory, any_redis_client, keys
) -> None:
    """A model's one batch stream (``{p:m}:jobs:batch``, before the deadline lanes) moves to
    the lane of each job's deadline, on one server and on a cluster (its keys share the
    model's tag); what a live worker holds stays with it until acked."""
    from datetime import timedelta

    from worker.queue.carried import carried_among
    from worker.queue.consumer import read_new
    from worker.queue.slack import lane_end
    from worker.store.base import utcnow

    client = any_redis_client
    jobs = prompt_jobs(4)
    for job in jobs:
        job.model = keys.model
    now = utcnow()
    jobs[0].deadline, jobs[1].deadline = now + timedelta(hours=1), now + timedelta(hours=48)
    with session_factory.begin() as s:
        ids = create_jobs(session=s, jobs=jobs)  # the rows name their model
    old = keys.unlaned_batch
    client.xgroup_create(old, keys.group, id="0", mkstream=True)
    for job_id, job in zip(ids, jobs, strict=True):
        entry = client.xadd(old, JobMessage(job_id=job_id, body=job.request).encode())
        client.hset(keys.carried, job_id, f"{old}|{entry}")
    client.xreadgroup(keys.group, "live-worker", {old: ">"}, count=1)  # holds ids[0]
    first = move_legacy_keys(session_factory=session_factory, redis_client=client,
                             keys=keys, mover="legacy-mover:w", min_idle_ms=60_000)
    assert (first.moved, first.dropped, first.finished) == (3, 0, False)
    assert carried_among(redis_client=client, keys=keys, job_ids=ids) == set(ids)
    (entry_id,) = [e for e, f in client.xrange(old) if f["job_id"] == ids[0]]
    client.xack(old, keys.group, entry_id)  # the live worker ended it
    client.hdel(keys.carried, ids[0])
    with session_factory.begin() as s:
        finish_jobs(session=s, results=[JobResult(job_id=ids[0], status="succeeded")],
                    worker_id="live")
    last = move_legacy_keys(session_factory=session_factory, redis_client=client,
                            keys=keys, mover="legacy-mover:w", min_idle_ms=60_000)
    assert last.finished and client.exists(old) == 0
    t = time.time()
    lanes = {f["job_id"]: lane for lane, _, f in batch_entries(client, keys)}
    assert lanes[ids[1]] == keys.lane(lane_end(jobs[1].deadline.timestamp(), t))
    assert keys.lane_end(lanes[ids[2]]) == keys.lane_end(lanes[ids[3]])  # default 24 h
    got = read_new(redis_client=client, keys=keys, consumer="c", count=5)
    assert [d.job_id for d in got] == [ids[2], ids[3], ids[1]]  # 24 h before 48 h
    assert got[2].message is not None
    assert got[2].message.deadline == pytest.approx(jobs[1].deadline.timestamp())
