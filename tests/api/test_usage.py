"""Usage from the traces: a real run of the tiny model through the API and a worker records
each job's engine-seconds, and they add up, over every job, to the wall time of the steps
the worker wrote to ``iterations``; the batch object, the job object and ``GET /v1/usage``
report them with the tokens (prompt tokens the prefix cache served counted apart)."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from tests.api.conftest import OPERATOR_KEY, ApiEnv, jsonl, tiny_worker, wait_expanded

pytestmark = pytest.mark.services

SHARED = "You are a careful assistant. Answer in one short sentence, plainly and politely. " * 3


def _wait_jobs(env: ApiEnv, h: dict[str, str], ids: list[str], timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    for job_id in ids:
        while env.client.get(f"/v1/jobs/{job_id}", headers=h).json()["status"] in (
                "queued", "running"):
            assert time.monotonic() < deadline, f"job {job_id} did not end"
            time.sleep(0.1)


def _step_seconds(env: ApiEnv, worker_id: str) -> tuple[float, int]:
    """The wall time of the steps the worker wrote that computed rows, and how many."""
    from sqlalchemy import select

    from worker.store.models import Iteration

    with env.ctx.session_factory() as s:
        rows = s.execute(select(Iteration).where(Iteration.worker_id == worker_id)).scalars().all()
    worked = [r for r in rows if r.num_prefill_tokens + r.num_decode_tokens > 0]
    return sum((r.schedule_ms + r.forward_ms + r.sample_ms) / 1000.0 for r in worked), len(worked)


def test_engine_seconds_of_all_jobs_add_up_to_the_steps(env: ApiEnv, tmp_path: Any) -> None:
    from sqlalchemy import select

    from worker.store.models import Job

    h = env.auth("t-usage")
    lines = [{"custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"messages": [{"role": "system", "content": SHARED},
                                    {"role": "user", "content": f"question {i}"}],
                       "max_tokens": 6 + i, "temperature": 0}} for i in range(6)]
    fid = env.client.post("/v1/files", headers=h, data={"purpose": "batch"},
                          files={"file": ("in.jsonl", jsonl(lines))}).json()["id"]
    batch = env.client.post("/v1/batches", headers=h, json={
        "input_file_id": fid, "endpoint": "/v1/chat/completions"}).json()
    wait_expanded(env, h, batch["id"])
    alone = [env.client.post("/v1/jobs", headers=h, json=body).json()["id"] for body in (
        {"prompt": "count: one two", "max_tokens": 9, "temperature": 0},
        {"prompt": "many samples", "max_tokens": 5, "n": 3, "temperature": 1.0, "seed": 1},
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "queue_class": "batch"},
    )]
    with tiny_worker(env, "usage-identity"):
        _wait_jobs(env, h, alone)
        deadline = time.monotonic() + 600
        while env.client.get(f"/v1/batches/{batch['id']}", headers=h).json()["status"] != "completed":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        # the batch's shared prefix is in the cache now: this one does not compute it
        late = env.client.post("/v1/jobs", headers=h, json={
            "messages": [{"role": "system", "content": SHARED},
                         {"role": "user", "content": "late question"}],
            "max_tokens": 3, "temperature": 0}).json()["id"]
        _wait_jobs(env, h, [late])
    with env.ctx.session_factory() as s:
        jobs = s.execute(select(Job).where(Job.tenant == "t-usage")).scalars().all()
    assert len(jobs) == 10 and all(j.status == "succeeded" for j in jobs)
    worker_id = jobs[0].worker_id
    assert all(j.worker_id == worker_id and (j.engine_seconds or 0) > 0 for j in jobs)
    steps, n_steps = _step_seconds(env, worker_id)
    assert n_steps > 10
    # the identity: every computed row's share of its step went to a job
    assert math.isclose(sum(j.engine_seconds or 0 for j in jobs), steps, rel_tol=1e-9)
    job = env.client.get(f"/v1/jobs/{late}", headers=h).json()
    cached = job["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < job["usage"]["prompt_tokens"]
    assert job["usage"]["engine_seconds"] > 0
    done = env.client.get(f"/v1/batches/{batch['id']}", headers=h).json()
    mine = [j for j in jobs if j.batch_id == batch["id"]]
    u = done["usage"]
    assert u["input_tokens"] == sum(j.prompt_tokens for j in mine)
    assert u["output_tokens"] == sum(j.completion_tokens for j in mine) == sum(6 + i for i in range(6))
    assert u["total_tokens"] == u["input_tokens"] + u["output_tokens"]
    assert u["input_tokens_details"]["cached_tokens"] == sum(j.cached_tokens or 0 for j in mine)
    assert math.isclose(u["engine_seconds"], sum(j.engine_seconds for j in mine), abs_tol=1e-5)
    from openai.types import Batch  # OpenAI's SDK reads the batch object, usage and all

    sdk = Batch.model_validate(done)
    assert sdk.usage is not None and sdk.usage.input_tokens_details.cached_tokens == (
        u["input_tokens_details"]["cached_tokens"])
    # the tenant's usage, by batch: the batch and the jobs submitted alone
    r = env.client.get("/v1/usage", headers=h, params={"group_by": "batch"})
    assert r.status_code == 200, r.text
    groups = {g["batch_id"]: g for g in r.json()["data"]}
    assert set(groups) == {batch["id"], None}
    assert groups[batch["id"]]["input_tokens"] == u["input_tokens"]
    assert groups[None]["jobs"] == 4
    total = env.client.get("/v1/usage", headers=h).json()["data"]
    assert len(total) == 1 and total[0]["jobs"] == 10
    assert math.isclose(total[0]["engine_seconds"], steps, abs_tol=1e-5)
    # another tenant sees none of it; the operator sees it under the tenant
    other = env.client.get("/v1/usage", headers=env.auth("t-usage-other")).json()["data"]
    assert other[0]["jobs"] == 0
    everyone = env.client.get("/v1/usage/tenants", headers={
        "Authorization": f"Bearer {OPERATOR_KEY}"}).json()["data"]
    assert next(g for g in everyone if g["tenant"] == "t-usage")["jobs"] == 10
