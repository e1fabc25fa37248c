"""Quotes and admission against the deadline, through the API on the real PostgreSQL and
Redis (a database of this module's own, so the open work and the live workers are only
what each test makes): the estimate's tokens (prompt tokens exact, counted as the worker
counts them), its engine-seconds at the live workers' measured costs, the work queued
ahead, the tenant's history; a dry run creates nothing; a window that cannot be met is
refused with the earliest one that can, unless the operator chose best effort; the batch
carries ``estimated_completion_at`` and the beat re-estimates it."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.api.conftest import PG_ADMIN_URL, PG_BASE, ApiEnv, jsonl
from tests.conftest import checkpoint_dir
from worker.store.schemas import JobResult

pytestmark = pytest.mark.services

PREFILL_S, DECODE_S = 0.001, 0.01  # the fake worker's measured cost of a token of each kind


@pytest.fixture(scope="module")
def own_db(api_db_url: str) -> Iterator[str]:
    """A migrated database for this module alone."""
    import psycopg

    from migrations.run import upgrade

    name = f"inflight_est_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    upgrade(url=PG_BASE + name)
    yield PG_BASE + name
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def est(make_env, own_db: str) -> Iterator[Any]:
    """A factory of envs on the module's database; afterwards it is emptied of workers,
    iterations, batches and jobs."""
    from sqlalchemy import delete

    from worker.store.models import Batch, Iteration, Job, Worker

    made: list[ApiEnv] = []

    def factory(**kw: Any) -> ApiEnv:
        env = make_env(database_url=own_db, tokenizer="tiny-llama", **kw)
        made.append(env)
        return env

    checkpoint_dir("tiny-llama")  # its tokenizer.json exists
    yield factory
    if made:
        with made[0].ctx.session_factory.begin() as s:
            for model in (Iteration, Worker, Job, Batch):
                s.execute(delete(model))


def _live_worker(env: ApiEnv, *, prefill_s: float = PREFILL_S, decode_s: float = DECODE_S,
                 name: str = "fake-worker", model: str = "tiny-llama") -> None:
    """A live worker whose recent steps say a prompt token costs ``prefill_s`` and an
    output token ``decode_s`` and a step nothing more: prompt steps of 50 to 150 rows,
    decode steps of 5 to 20, one sequence each."""
    from worker.store.base import utcnow
    from worker.store.crud.workers import register_worker
    from worker.store.models import Iteration

    with env.ctx.session_factory.begin() as s:
        register_worker(session=s, worker_id=name, host="h", model=model, pid=1)
        for step in range(100):
            prefill, decode = ((50 + step, 0) if step % 2 else (0, 5 + step % 16))
            ms = 1000.0 * (prefill * prefill_s + decode * decode_s)
            s.add(Iteration(worker_id=name, step=step, time=utcnow(), num_running=1,
                            num_waiting=0, num_prefill_tokens=prefill, num_decode_tokens=decode,
                            kv_blocks_used=1, kv_blocks_total=8, num_preemptions=0,
                            num_admitted=0, num_finished=0, schedule_ms=0.0, forward_ms=ms,
                            sample_ms=0.0, num_interactive_tokens=0))


def _upload(env: ApiEnv, h: dict[str, str], lines: list[dict[str, Any]]) -> str:
    r = env.client.post("/v1/files", headers=h, data={"purpose": "batch"},
                        files={"file": ("in.jsonl", jsonl(lines))})
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


def _lines(n: int, *, prompt: int = 40, max_tokens: int = 20) -> list[dict[str, Any]]:
    return [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
             "body": {"prompt": [7] * prompt, "max_tokens": max_tokens}} for i in range(n)]


def _batch(env: ApiEnv, h: dict[str, str], fid: str, **kw: Any) -> Any:
    return env.client.post("/v1/batches", headers=h, json={
        "input_file_id": fid, "endpoint": "/v1/completions", **kw})


def _nothing_created(env: ApiEnv, h: dict[str, str], files: int) -> None:
    from sqlalchemy import func, select

    from worker.store.models import Batch, Job

    with env.ctx.session_factory() as s:
        assert s.scalar(select(func.count()).select_from(Batch)) == 0
        assert s.scalar(select(func.count()).select_from(Job)) == 0
    assert len(env.client.get("/v1/files", headers=h).json()["data"]) == files
    for stream in env.ctx.redis.scan_iter(match=f"{env.ctx.keys.prefix}:*"):
        assert env.ctx.redis.type(stream) != b"stream" or not env.ctx.redis.xlen(stream)


def test_the_api_counts_prompt_tokens_as_the_worker_does() -> None:
    """The API's tokenizer (tokenizers + the chat template in jinja2, no transformers)
    against the worker's (transformers' apply_chat_template), token for token."""
    from transformers import AutoTokenizer

    from api.tokenizer import PromptCounter
    from worker.engine.request_validation import tokenize
    from worker.protocol.openai_batch import parse_request_body

    bodies: list[dict[str, Any]] = [
        {"messages": [{"role": "user", "content": "Hi there, how are you?"}]},
        {"messages": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "Name three colours: é ß 你好 \U0001f600"},
                      {"role": "assistant", "content": "red"},
                      {"role": "user", "content": [{"type": "text", "text": "more"},
                                                   {"type": "text", "text": " please"}]}]},
        {"prompt": "The capital of France is"},
        {"prompt": "  leading spaces\n\nand <|im_end|> inside"},
        {"prompt": [5, 6, 7, 8]},
    ]
    for spec in ("tiny-llama", "tiny-qwen2"):
        tok = AutoTokenizer.from_pretrained(checkpoint_dir(spec))
        counter = PromptCounter(spec)
        reqs = [parse_request_body(b, endpoint="/v1/chat/completions" if "messages" in b
                                   else "/v1/completions") for b in bodies]
        worker = [len(r.prompt) if isinstance(r.prompt, list)
                  else len(tokenize(tok, messages=r.messages)) if r.messages is not None
                  else len(tokenize(tok, prompt=r.prompt)) for r in reqs]
        assert counter.exact and counter.count(reqs) == worker, spec
    bound = PromptCounter(None)  # no tokenizer: the UTF-8 bound, and says so
    assert not bound.exact and bound.count(reqs[2:3])[0] >= worker[2]


def test_a_batch_quote_prices_the_work_and_creates_nothing(est) -> None:
    env = est()
    h = env.auth("t-quote")
    text_line = {"custom_id": "text", "method": "POST", "url": "/v1/completions",
                 "body": {"prompt": "The capital of France is", "max_tokens": 8, "n": 2}}
    fid = _upload(env, h, [*_lines(9), text_line, {"custom_id": "bad", "url": "/nope"}])
    r = _batch(env, h, fid, dry_run=True)  # no live worker: tokens, no time
    assert r.status_code == 200, r.text
    q = r.json()
    text_tokens = q["prompt_tokens"] - 9 * 40
    assert q["object"] == "batch.quote" and q["requests"] == 10 and q["prompt_tokens_exact"]
    assert 0 < text_tokens < len("The capital of France is")
    assert q["output_tokens"] == {"bound": 9 * 20 + 8 * 2, "expected": 9 * 20 + 8 * 2}
    assert q["engine_seconds"] is None and q["estimated_completion_at"] is None
    _live_worker(env, model="another-model", name="other-worker")  # not this batch's model
    q = _batch(env, h, fid, dry_run=True).json()
    assert q["engine_seconds"] is None and q["basis"]["live_workers"] == 0
    _live_worker(env)
    before = time.time()
    q = _batch(env, h, fid, dry_run=True, completion_window="2h").json()
    engine_s = q["prompt_tokens"] * PREFILL_S + q["output_tokens"]["expected"] * DECODE_S
    assert math.isclose(q["engine_seconds"], engine_s, rel_tol=1e-6)
    assert q["queue_ahead_engine_seconds"] == 0 and q["basis"]["live_workers"] == 1
    assert before + engine_s - 2 <= q["estimated_completion_at"] <= time.time() + engine_s + 1
    assert q["meets_window"] is True and q["earliest_completion_window"] == "1h"
    _nothing_created(env, h, files=1)


def test_an_unmeetable_window_is_refused_with_the_earliest_that_can_be_met(est) -> None:
    env = est()
    h = env.auth("t-window")
    _live_worker(env, decode_s=3.0)  # 20 output tokens x 100 lines: 6000 s, 1 h 40 min
    fid = _upload(env, h, _lines(100))
    r = _batch(env, h, fid, completion_window="1h")
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "completion_window_unmeetable" and err["param"] == "completion_window"
    assert err["earliest_completion_window"] == "2h" and "2h" in err["message"]
    _nothing_created(env, h, files=1)
    ok = _batch(env, h, fid, completion_window="2h")
    assert ok.status_code == 200, ok.text
    batch = ok.json()
    assert batch["status"] == "validating"
    eta = batch["estimated_completion_at"]
    assert eta is not None and batch["created_at"] + 5900 <= eta <= batch["created_at"] + 7200
    # the next batch queues behind it: its own work plus the first's
    q = _batch(env, h, _upload(env, h, _lines(20)), dry_run=True, completion_window="2h").json()
    assert math.isclose(q["queue_ahead_engine_seconds"], 100 * (40 * PREFILL_S + 20 * 3.0),
                        rel_tol=1e-6)
    assert q["meets_window"] is False and q["earliest_completion_window"] == "3h"
    # one due sooner is read before it (workers read by deadline): nothing queued ahead
    soon = _batch(env, h, _upload(env, h, _lines(1)), dry_run=True, completion_window="1h").json()
    assert soon["queue_ahead_engine_seconds"] == 0 and soon["meets_window"] is True
    # an operator who prefers best effort admits it all the same
    lenient = est(deadline_admission=False)
    h2 = lenient.auth("t-window-2")
    r = _batch(lenient, h2, _upload(lenient, h2, _lines(100)), completion_window="1h")
    assert r.status_code == 200 and r.json()["estimated_completion_at"] is not None


def test_history_sets_the_expected_output_and_the_beat_re_estimates(est) -> None:
    from api.control.estimate import refresh_estimates
    from worker.store.crud.job_status import finish_jobs
    from worker.store.crud.jobs import list_jobs
    from worker.store.models import Batch

    env = est()
    h = env.auth("t-history")
    _live_worker(env)
    fid = _upload(env, h, _lines(20))
    batch = _batch(env, h, fid).json()
    assert env.app.state.dispatcher.wait_idle(30)
    # its jobs produce a quarter of what they were allowed; half of them end
    with env.ctx.session_factory.begin() as s:
        jobs = list_jobs(session=s, batch_id=batch["id"], limit=100)
        assert jobs and all(j.max_tokens == 20 for j in jobs)
        finish_jobs(session=s, worker_id="fake-worker", results=[
            JobResult(job_id=j.id, status="succeeded", text="x", finish_reason="stop",
                      prompt_tokens=40, completion_tokens=5) for j in jobs[:10]])
    q = _batch(env, h, fid, dry_run=True).json()
    assert q["basis"]["history_jobs"] == 10 and q["basis"]["output_ratio"] == 0.25
    assert q["output_tokens"] == {"bound": 400, "expected": 100}
    # re-estimated: half the batch left
    with env.ctx.session_factory.begin() as s:
        s.get(Batch, batch["id"]).estimated_completion_at = None
    assert refresh_estimates(env.ctx) == 1
    view = env.client.get(f"/v1/batches/{batch['id']}", headers=h).json()
    left = 10 * (40 * PREFILL_S + 20 * DECODE_S)
    assert abs(view["estimated_completion_at"] - (time.time() + left)) <= 2


def _interactive_steps(env: ApiEnv, *, seconds_apart: float, name: str) -> None:
    """A live worker that ran only interactive requests: 100 steps of 0.1 s each, prompt
    and output rows in turn, one step every ``seconds_apart`` seconds."""
    from datetime import timedelta

    from worker.store.base import utcnow
    from worker.store.crud.workers import register_worker
    from worker.store.models import Iteration

    start = utcnow() - timedelta(seconds=100 * seconds_apart)
    with env.ctx.session_factory.begin() as s:
        register_worker(session=s, worker_id=name, host="h", model="tiny-llama", pid=1)
        for step in range(100):
            prefill, decode = ((20 + step, 0) if step % 2 else (0, 1 + step % 3))
            s.add(Iteration(worker_id=name, step=step,
                            time=start + timedelta(seconds=step * seconds_apart),
                            num_running=1, num_waiting=0, num_prefill_tokens=prefill,
                            num_decode_tokens=decode, kv_blocks_used=1, kv_blocks_total=8,
                            num_preemptions=0, num_admitted=0, num_finished=0,
                            schedule_ms=0.0, forward_ms=100.0, sample_ms=0.0,
                            num_interactive_tokens=prefill + decode))


def test_a_worker_idle_between_interactive_requests_has_its_time_for_a_batch(est) -> None:
    """The interactive share is of the worker's time, not of its steps: every recent step
    of a worker that ran a few interactive requests was interactive, yet a batch that
    arrives gets nearly all of it (a quote of 37 h for a few minutes' work refused a batch
    with a 24 h window after light interactive traffic); back to back, the same steps
    leave the batch the floor."""
    from datetime import timedelta

    from sqlalchemy import delete

    from worker.store.crud.throughput import step_costs
    from worker.store.models import Iteration

    env = est()
    _interactive_steps(env, seconds_apart=1.0, name="light-worker")
    with env.ctx.session_factory() as s:
        light = step_costs(session=s, worker_timeout=timedelta(minutes=1), model="tiny-llama")
    assert light is not None
    # 92 measured steps (the first WARM_STEPS left out) of 0.1 s over 91.1 s
    assert math.isclose(light.interactive_share, 92 * 0.1 / 91.1, rel_tol=1e-3)
    assert math.isclose(light.batch_capacity, 1 - 92 * 0.1 / 91.1, rel_tol=1e-3)
    h = env.auth("t-light")
    q = _batch(env, h, _upload(env, h, _lines(10)), dry_run=True, completion_window="24h").json()
    assert q["engine_seconds"] > 0 and q["basis"]["interactive_share"] < 0.11
    assert q["estimated_completion_at"] <= time.time() + q["engine_seconds"] / 0.85 + 1
    with env.ctx.session_factory.begin() as s:  # the same steps, back to back
        s.execute(delete(Iteration))
    _interactive_steps(env, seconds_apart=0.1, name="light-worker")
    with env.ctx.session_factory() as s:
        busy = step_costs(session=s, worker_timeout=timedelta(minutes=1), model="tiny-llama")
    assert busy is not None and math.isclose(busy.interactive_share, 1.0, rel_tol=1e-6)
    assert busy.batch_capacity == 0.05


def test_a_job_quote_creates_nothing(est) -> None:
    env = est()
    h = env.auth("t-job-quote")
    _live_worker(env)
    body = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 12,
            "dry_run": True}
    r = env.client.post("/v1/jobs", headers=h, json=body)
    assert r.status_code == 200, r.text
    q = r.json()
    assert q["object"] == "job.quote" and q["requests"] == 1 and q["prompt_tokens_exact"]
    assert q["output_tokens"]["bound"] == 12 and q["queue_ahead_engine_seconds"] == 0
    assert math.isclose(q["engine_seconds"],
                        q["prompt_tokens"] * PREFILL_S + 12 * DECODE_S, rel_tol=1e-6)
    bad = env.client.post("/v1/jobs", headers=h, json={**body, "max_tokens": 10 ** 6})
    assert bad.status_code == 400  # checked as a submission is
    _nothing_created(env, h, files=0)
    assert env.client.get("/v1/jobs", headers=h).json()["data"] == []
    with env.ctx.session_factory() as s:
        from worker.store.crud.tenant_usage import open_jobs

        assert open_jobs(session=s, tenant="t-job-quote") == 0


def test_the_step_cost_fit_recovers_a_fixed_part_and_the_costs_per_row() -> None:
    """Steps of a fixed 30 ms plus 0.5 ms per prompt row and 2 ms per output row, with
    noise: the fit finds the three parts, so a token's cost falls with the concurrency."""
    import random

    from api.control.estimate import Work, engine_seconds
    from worker.store.crud.throughput import StepCosts, TenantHistory, fit_step_cost

    rng = random.Random(3)
    samples = []
    for _ in range(400):
        p, d = rng.choice([0, 0, 64, 256]), rng.randint(1, 64)
        samples.append((p, d, (0.030 + 0.0005 * p + 0.002 * d) * rng.uniform(0.97, 1.03)))
    step_s, prefill_s, decode_s = fit_step_cost(samples) or (0, 0, 0)
    assert abs(step_s - 0.030) < 0.003 and abs(prefill_s - 0.0005) < 0.00005
    assert abs(decode_s - 0.002) < 0.0002
    assert fit_step_cost(samples[:5]) is None  # too few steps to measure
    costs = StepCosts(0.030, 0.0005, 0.002, 0.0, workers=1, max_running=32)
    none = TenantHistory(0, None, None)
    one = Work(requests=1, prompt_tokens=100, output_bound=50, longest_output=50)
    many = Work(requests=64, prompt_tokens=6400, output_bound=3200, longest_output=50)
    # alone, a request pays every step's fixed part; 32 at once share it
    assert math.isclose(engine_seconds(one, costs, none), 50 * 0.030 + 100 * 0.0005 + 50 * 0.002)
    assert math.isclose(engine_seconds(many, costs, none),
                        (3200 / 32) * 0.030 + 6400 * 0.0005 + 3200 * 0.002)
