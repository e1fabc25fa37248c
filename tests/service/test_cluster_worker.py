"""A worker serving jobs through a real three-node Redis Cluster (made by the test
session): both classes of jobs, a cancel, an unreadable entry dead-lettered, a job whose
publish was lost re-published by the reconciler, the streams trimmed."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.service.helpers import batch_lanes, prompt_jobs, raw_batch_entry, wait_for, worker_thread
from worker.jobs.cancel import request_cancel
from worker.jobs.enqueue import enqueue
from worker.store.crud.job_status import create_jobs
from worker.store.crud.jobs import get_job
from worker.store.schemas import NewJob

pytestmark = pytest.mark.services


@pytest.fixture
def cluster_client(redis_cluster, keys):
    from worker.queue.connection import make_redis
    from worker.queue.wipe import delete_deployment

    client = make_redis(url=redis_cluster.url)
    yield client
    delete_deployment(redis_client=client, keys=keys)
    client.close()


def _engine(_config: Any) -> Any:
    from worker.engine import EngineArgs, LLMEngine

    class Paced(LLMEngine):
        def step(self, between_layers=None):  # a few seconds for the long job, to cancel it while it runs
            time.sleep(0.01)
            return super().step(between_layers)

    return Paced(EngineArgs(model="tiny-llama", max_num_seqs=8, num_kv_blocks=64,
                            max_model_len=256))


def test_a_worker_serves_jobs_through_a_redis_cluster(
    migrated_pg, session_factory, redis_cluster, cluster_client, keys
) -> None:
    from worker.queue.stream_stats import stream_stats
    from worker.service.config import WorkerConfig

    r = cluster_client
    batch = enqueue(session_factory=session_factory, redis_client=r, keys=keys,
                    jobs=prompt_jobs(6))
    inter = enqueue(session_factory=session_factory, redis_client=r, keys=keys,
                    jobs=prompt_jobs(2, cls="interactive", tag="i"))
    (long,) = enqueue(session_factory=session_factory, redis_client=r, keys=keys, jobs=[
        NewJob(request={"url": "/v1/completions", "body": {
            "prompt": "go", "max_tokens": 240, "ignore_eos": True}}, queue_class="interactive")])
    raw_batch_entry(r, keys, {"v": "1", "job_id": "job_garbled", "body": "{not json"})
    with session_factory.begin() as s:  # committed, then its publish was lost
        (lost,) = create_jobs(session=s, jobs=prompt_jobs(1, tag="lost"))
    config = WorkerConfig(
        database_url=migrated_pg, redis_url=redis_cluster.url, model="tiny-llama",
        prefix=keys.prefix, name="cluster", heartbeat_interval=0.3, cancel_poll_interval=0.05,
        reconcile_interval=1, reconcile_grace=0, trim_interval=0.5,
    )

    def status(job_id: str) -> str:
        with session_factory() as s:
            return get_job(session=s, job_id=job_id).status

    with worker_thread(config, _engine):
        wait_for(lambda: status(long) == "running", timeout=60, what="the long job to start")
        assert request_cancel(session_factory=session_factory, redis_client=r, keys=keys,
                              job_id=long) == "running"
        every = [*batch, *inter, long, lost]
        wait_for(lambda: all(status(j) not in ("queued", "running") for j in every),
                 timeout=120, what="every job to end")
        wait_for(lambda: batch_lanes(r, keys) == [], timeout=30,
                 what="the drained lanes to be dropped, with their acked entries")
    assert [status(j) for j in [*batch, *inter, lost]] == ["succeeded"] * 9
    assert status(long) == "cancelled"
    dead = r.xrange(keys.dead)
    assert [f["job_id"] for _, f in dead] == ["job_garbled"]
    assert "unreadable" in dead[0][1]["dead_reason"]
    stats = {s.kind: s for s in stream_stats(redis_client=r, keys=keys)}
    assert "batch" not in stats and stats["interactive"].pending == 0
    assert stats["dead"].length == 1
    with session_factory() as s:
        assert get_job(session=s, job_id=lost).attempts == 1  # published once, run once
