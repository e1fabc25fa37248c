"""The worker in-process on the tiny model: results, bad jobs failing alone, cancellation,
traces, redelivery of a finished job, drain."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import select

from tests.service.conftest import REDIS_URL
from tests.service.helpers import prompt_jobs, wait_for, worker_thread
from worker.jobs.cancel import request_cancel
from worker.jobs.enqueue import enqueue
from worker.queue.lanes import lane_states
from worker.queue.message import JobMessage
from worker.queue.producer import publish
from worker.service.config import WorkerConfig
from worker.service.worker import WorkerProcess
from worker.store.crud.jobs import count_by_status, get_job, list_jobs
from worker.store.models import Iteration, Job
from worker.store.schemas import NewJob

pytestmark = pytest.mark.services


def _engine(config: WorkerConfig):
    from worker.engine import EngineArgs, LLMEngine

    class PacedEngine(LLMEngine):
        """The tiny model finishes a 240-token job in well under a second; 10 ms per step
        leaves the test a few seconds to see the long job running and cancel it."""

        def step(self, between_layers=None):
            time.sleep(0.01)
            return super().step(between_layers)

    return PacedEngine(EngineArgs(model="tiny-llama", max_num_seqs=8, num_kv_blocks=64, max_model_len=256))


def test_worker_runs_jobs_and_isolates_bad_ones(migrated_pg, session_factory, redis_client, keys) -> None:
    config = WorkerConfig(
        database_url=migrated_pg, redis_url=REDIS_URL, model="tiny-llama", prefix=keys.prefix, name="inproc",
        heartbeat_interval=0.3, cancel_poll_interval=0.05, reconcile_interval=3600,
    )
    good = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys, jobs=prompt_jobs(12))
    bad_jobs = [
        NewJob(request={"url": "/v1/completions", "body": {"prompt": "x", "bogus": 1}}),  # validation
        NewJob(request={"url": "/v1/completions", "body": {"prompt": "x " * 400, "max_tokens": 4}}),  # too long
        NewJob(request={"url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}}),
    ]
    bad = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys, jobs=bad_jobs)
    long = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys,
                   jobs=[NewJob(request={"url": "/v1/completions", "body": {"prompt": "go", "max_tokens": 240, "ignore_eos": True}}, queue_class="interactive")])
    w = WorkerProcess(config, engine_factory=_engine, install_signals=False)
    t = threading.Thread(target=w.run)
    t.start()
    try:
        def _status(job_id: str) -> str:
            with session_factory() as s:
                return get_job(session=s, job_id=job_id).status

        wait_for(lambda: _status(long[0]) == "running", timeout=60, what="the long job to start")
        assert request_cancel(session_factory=session_factory, redis_client=redis_client, keys=keys, job_id=long[0]) == "running"
        wait_for(lambda: all(_status(j) not in ("queued", "running") for j in good + bad + long), timeout=60, what="all jobs to end")
        # a redelivered job that already succeeded is acked and skipped
        with session_factory() as s:
            done = get_job(session=s, job_id=good[0])
        publish(redis_client=redis_client, keys=keys, messages=[("batch", JobMessage(job_id=done.id, body=done.request))])
        wait_for(lambda: w.loop is not None and all(
            lane.remaining == 0 for lane in lane_states(redis_client=redis_client, keys=keys)),
                 timeout=20, what="the duplicate to be read and acked")
    finally:
        w.stop()
        t.join(60)
    assert not t.is_alive()
    with session_factory() as s:
        jobs = {j.id: j for j in list_jobs(session=s, limit=1000)}
        assert all(jobs[j].status == "succeeded" and jobs[j].completion_tokens == 6 for j in good)
        assert jobs[good[0]].text == done.text and jobs[good[0]].attempts == 1
        assert jobs[bad[0]].status == "failed" and "bogus" in jobs[bad[0]].error
        assert jobs[bad[1]].status == "failed" and "context" in jobs[bad[1]].error
        # the tiny model has a chat template, so the chat job succeeds (unseeded sampling:
        # the text varies, and an early EOS is possible though never seen)
        chat = jobs[bad[2]]
        assert chat.status == "succeeded" and chat.error is None, (chat.status, chat.error)
        assert chat.finish_reason in ("length", "stop") and 1 <= chat.completion_tokens <= 4
        assert jobs[long[0]].status == "cancelled" and (jobs[long[0]].completion_tokens or 0) < 240
        ok = jobs[good[-1]]
        assert ok.first_step is not None and ok.last_step >= ok.first_step and ok.first_token_at is not None
        steps = list(s.scalars(
            select(Iteration)
            .where(Iteration.worker_id == ok.worker_id, Iteration.step >= ok.first_step,
                   Iteration.step <= ok.last_step)
            .order_by(Iteration.step)
        ))
        assert [it.step for it in steps] == list(range(ok.first_step, ok.last_step + 1))
        assert all(it.num_prefill_tokens + it.num_decode_tokens >= 1 for it in steps)
        mates = s.scalars(select(Job.id).where(
            Job.worker_id == ok.worker_id, Job.id != ok.id,
            Job.first_step <= ok.last_step, Job.last_step >= ok.first_step)).all()
        assert mates  # it shared its batch with other jobs
        assert count_by_status(session=s).get("running", 0) == 0
    assert w.stats["skipped"] >= 1


def test_the_stored_result_is_the_whole_answer(migrated_pg, session_factory, redis_client, keys) -> None:
    """n samples, their token ids and logprobs go through the queue and the store, and the
    job view serves them in the OpenAI shapes of both endpoints."""
    from api.views import response_body

    config = WorkerConfig(
        database_url=migrated_pg, redis_url=REDIS_URL, model="tiny-llama", prefix=keys.prefix, name="whole",
        heartbeat_interval=0.3, reconcile_interval=3600,
    )
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "n": 3, "seed": 7,
            "temperature": 1.0, "logprobs": True, "top_logprobs": 2, "ignore_eos": True}
    completion = {"prompt": "one two", "max_tokens": 4, "n": 2, "logprobs": 3, "temperature": 0,
                  "ignore_eos": True}
    ids = enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys, jobs=[
        NewJob(request={"url": "/v1/chat/completions", "body": chat}),
        NewJob(request={"url": "/v1/completions", "body": completion}),
    ])

    def ended() -> bool:
        with session_factory() as s:
            return all(get_job(session=s, job_id=j).status == "succeeded" for j in ids)

    with worker_thread(config, _engine):
        wait_for(ended, timeout=60, what="both jobs to succeed")
    with session_factory() as s:
        chat_job, completion_job = (get_job(session=s, job_id=j) for j in ids)
    chat_body = response_body(chat_job, model_name="tiny")
    assert [c["index"] for c in chat_body["choices"]] == [0, 1, 2]
    assert chat_body["usage"]["completion_tokens"] == 15 == chat_job.completion_tokens
    for c in chat_body["choices"]:
        assert len(c["token_ids"]) == 5 and c["finish_reason"] == "length"
        content = c["logprobs"]["content"]
        assert len(content) == 5 and all(len(p["top_logprobs"]) == 2 for p in content)
        assert all(p["logprob"] <= 0 and p["bytes"] == list(p["token"].encode()) for p in content)
    body = response_body(completion_job, model_name="tiny")
    first, second = body["choices"]
    assert first["text"] == second["text"] and first["token_ids"] == second["token_ids"]  # greedy
    lp = first["logprobs"]
    assert len(lp["tokens"]) == 4 == len(lp["token_logprobs"]) == len(lp["top_logprobs"])
    # each token decoded alone (a random model's text splits multi-byte characters, so the
    # joined tokens need not equal the text); offsets count the tokens' characters
    offsets = [sum(len(t) for t in lp["tokens"][:i]) for i in range(4)]
    assert lp["text_offset"] == offsets and all(isinstance(x, float) for x in lp["token_logprobs"])
    assert all(len(top) <= 3 for top in lp["top_logprobs"])
