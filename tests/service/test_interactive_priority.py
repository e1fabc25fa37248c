"""A worker whose engine is full of batch work still reads the interactive stream and
serves an interactive job at once (issue 27: interactive work is never starved)."""

from __future__ import annotations

import time

import pytest

from tests.service.conftest import REDIS_URL
from tests.service.helpers import wait_for, worker_thread
from worker.jobs.enqueue import enqueue
from worker.service.config import WorkerConfig
from worker.store.crud.jobs import get_job
from worker.store.schemas import NewJob

pytestmark = pytest.mark.services


def _jobs(n: int, *, max_tokens: int, cls: str) -> list[NewJob]:
    body = {"prompt": "the quick brown fox", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    return [NewJob(request={"url": "/v1/completions", "body": body}, queue_class=cls) for _ in range(n)]


def _engine(config: WorkerConfig):
    from worker.engine import EngineArgs, LLMEngine

    class PacedEngine(LLMEngine):
        def step(self, between_layers=None):
            time.sleep(0.01)  # the batch backlog takes seconds, an interactive job a few steps
            return super().step(between_layers)

    return PacedEngine(EngineArgs(model="tiny-llama", max_num_seqs=8, num_kv_blocks=256,
                                  max_model_len=256))


def test_an_interactive_job_overtakes_a_batch_backlog(migrated_pg, session_factory, redis_client,
                                                      keys) -> None:
    config = WorkerConfig(
        database_url=migrated_pg, redis_url=REDIS_URL, model="tiny-llama", prefix=keys.prefix,
        name="classes", heartbeat_interval=0.3, reconcile_interval=3600,
    )
    batch = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys,
                    jobs=_jobs(16, max_tokens=200, cls="batch"))  # 200 steps a wave

    def status(job_id: str) -> str:
        with session_factory() as s:
            return get_job(session=s, job_id=job_id).status

    with worker_thread(config, _engine):
        wait_for(lambda: sum(status(j) == "running" for j in batch) >= 6, timeout=60,
                 what="the batch backlog to fill the engine")
        [urgent] = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys,
                           jobs=_jobs(1, max_tokens=4, cls="interactive"))
        wait_for(lambda: status(urgent) == "succeeded", timeout=30, what="the interactive job",
                 interval=0.05)
        done = sum(status(j) == "succeeded" for j in batch)
    # it did not wait for a slot: it started in the engine's next step, while the first
    # wave of batch jobs (the engine full of them) was still decoding
    assert done == 0, f"the interactive job waited for {done} batch jobs to end"
