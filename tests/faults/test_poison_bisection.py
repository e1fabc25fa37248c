"""A job whose presence makes ``engine.step()`` raise is found by bisection, in the worker's
own process: each half of the failed batch re-runs as a group with nothing else in the
engine, a group that fails again is halved again, and only the job that fails on its own is
failed. The others finish in groups, not one at a time, and keep why they ran isolated."""

from __future__ import annotations

import math

import pytest

from tests.service.conftest import REDIS_URL
from tests.service.helpers import prompt_jobs, wait_for, worker_thread
from worker.jobs.enqueue import enqueue
from worker.service.config import WorkerConfig
from worker.store.crud.jobs import list_jobs
from worker.store.schemas import NewJob

pytestmark = pytest.mark.services

N_GOOD = 40


def _poisoned_engine(config: WorkerConfig):
    """tiny-llama whose step raises while a request with POISON in its prompt is in it."""
    from worker.engine import EngineArgs, LLMEngine

    class PoisonedEngine(LLMEngine):
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*args, **kwargs)
            self.poisoned: set[str] = set()

        def add_request(self, request_id, prompt_token_ids, params=None, **kw):  # type: ignore[no-untyped-def]
            if "POISON" in (kw.get("prompt") or ""):
                self.poisoned.add(request_id)
            return super().add_request(request_id, prompt_token_ids, params, **kw)

        def abort_request(self, request_id: str) -> None:
            self.poisoned.discard(request_id)
            super().abort_request(request_id)

        def step(self, between_layers=None):
            if self.poisoned:
                raise RuntimeError("device-side assert triggered")
            return super().step(between_layers)

    return PoisonedEngine(
        EngineArgs(model="tiny-llama", max_num_seqs=64, num_kv_blocks=256, max_model_len=256,
                   attention_backend="torch")
    )


def test_one_bad_job_among_many_is_bisected_out(migrated_pg, session_factory, redis_client, keys) -> None:
    good = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys,
                   jobs=prompt_jobs(N_GOOD // 2))
    (poison,) = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys, jobs=[
        NewJob(request={"url": "/v1/completions", "body": {"prompt": "POISON pill", "max_tokens": 4}})])
    good += enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys,
                    jobs=prompt_jobs(N_GOOD // 2, tag="late"))
    config = WorkerConfig(database_url=migrated_pg, redis_url=REDIS_URL, model="tiny-llama",
                          prefix=keys.prefix, name="bisect", prefetch=64, reconcile_interval=3600)

    def ended() -> bool:
        with session_factory() as s:
            return all(j.status not in ("queued", "running") for j in list_jobs(session=s, limit=1000))

    with worker_thread(config, _poisoned_engine) as w:
        wait_for(ended, timeout=120, what="every job to end")
    with session_factory() as s:
        jobs = {j.id: j for j in list_jobs(session=s, limit=1000)}
    assert jobs[poison].status == "failed" and "the engine failed on this job" in jobs[poison].error
    assert "device-side assert" in jobs[poison].error
    assert all(jobs[j].status == "succeeded" and jobs[j].attempts == 1 for j in good)
    isolated = [j for j in good if jobs[j].isolation]
    assert isolated, "the poison job never shared a step with another job"
    assert all("re-run in an isolated group of" in (jobs[j].isolation or "") for j in isolated)
    # bisection: about two groups per halving, not one run per suspect
    assert w.loop is not None
    halvings = math.ceil(math.log2(len(isolated) + 1))
    runs = w.loop.counters.isolated_runs
    assert runs <= 2 * halvings, (runs, len(isolated))
    assert runs < len(isolated)
