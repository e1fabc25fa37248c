"""Accepted inputs that used to break something later (issue 26, part A), through the real
API on PostgreSQL: logprobs under a grammar reach the store; a non-finite number or a lone
surrogate is refused where it enters (a 400, or that line's error in a batch) instead of
breaking the write; the webhook secret is for keys that can write, and rotating it twice
at once answers 200 twice; the store's own error text never reaches the tenant."""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.api.conftest import ApiEnv, jsonl, tiny_worker, wait_expanded
from tests.jsonl import read_jsonl
from tests.service.helpers import wait_for

pytestmark = pytest.mark.services

@pytest.fixture
def worker(env: ApiEnv) -> Iterator[Any]:
    with tiny_worker(env, "stored-values", max_num_seqs=8, num_kv_blocks=128, max_model_len=256,
                     attention_backend="torch", prepack_weights=False) as w:
        yield w


def _wait_job(env: ApiEnv, headers: dict[str, str], job_id: str) -> dict[str, Any]:
    box: dict[str, Any] = {}

    def ended() -> bool:
        resp = env.client.get(f"/v1/jobs/{job_id}", headers=headers)
        assert resp.status_code == 200, resp.text
        box["job"] = resp.json()
        return box["job"]["status"] not in ("queued", "running")

    wait_for(ended, timeout=120, what=f"job {job_id} to end")
    return box["job"]


# ------------------------------------------------------------ logprobs and a grammar


def test_logprobs_with_a_guided_choice_are_stored_and_returned(env: ApiEnv, worker) -> None:
    """``logprobs: true, top_logprobs: 5`` with ``guided_choice``: the grammar leaves one or
    two tokens possible, so scores after its mask were -inf, which PostgreSQL refused
    ("could not store the result"). The job succeeds with finite scores."""
    h = env.auth("t-logprobs")
    body = {"messages": [{"role": "user", "content": "yes or no?"}], "max_tokens": 8,
            "logprobs": True, "top_logprobs": 5, "guided_choice": ["yes", "no"],
            "temperature": 0.7, "seed": 1}
    created = env.client.post("/v1/jobs", json=body, headers=h)
    assert created.status_code == 201, created.text
    job = _wait_job(env, h, created.json()["id"])
    assert job["status"] == "succeeded", job["error"]
    choice = job["result"]["choices"][0]
    assert choice["message"]["content"] in ("yes", "no")
    content = choice["logprobs"]["content"]
    assert content
    for entry in content:
        assert len(entry["top_logprobs"]) == 5
        values = [entry["logprob"], *(t["logprob"] for t in entry["top_logprobs"])]
        assert all(math.isfinite(v) for v in values), entry


def test_a_result_the_store_refuses_fails_without_the_drivers_text(
    env: ApiEnv, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The job fails with a generic message and its code; the driver's text (tables,
    values) goes to the worker's log only."""
    from worker.jobs import finish as finish_module
    from worker.store.crud import job_status
    from worker.store.crud.job_status import create_jobs
    from worker.store.crud.jobs import get_job
    from worker.store.schemas import JobResult, NewJob

    with env.ctx.session_factory.begin() as s:
        (job_id,) = create_jobs(session=s, jobs=[NewJob(request={"prompt": "x"}, tenant="t-w")])
    real = job_status.finish_jobs

    def refusing(*, session, results, worker_id):
        if any(r.status == "succeeded" for r in results):
            raise ValueError('psycopg.errors.UntranslatableCharacter: relation "jobs" secret-detail')
        return real(session=session, results=results, worker_id=worker_id)

    monkeypatch.setattr(job_status, "finish_jobs", refusing)
    done = JobResult(job_id=job_id, status="succeeded", text="ok")
    assert finish_module.commit_results(
        session_factory=env.ctx.session_factory, results=[done], worker_id="w-1"
    ) == []
    with env.ctx.session_factory() as s:
        job = get_job(session=s, job_id=job_id)
    assert job.status == "failed"
    assert job.error == finish_module.UNSTORABLE_RESULT_ERROR
    assert "result_not_storable" in job.error and "psycopg" not in job.error
    assert "secret-detail" in caplog.text  # the detail is in the log


# ------------------------------------------------------ non-finite numbers, surrogates

BIG = "1e400"  # valid JSON; Python reads it as inf, which PostgreSQL refuses


def _schema_format(description: str) -> str:
    return ('{"type": "json_schema", "json_schema": {"name": "r", "description": '
            + description + ', "schema": {"type": "object"}}}')


def test_post_job_with_1e400_anywhere_is_a_400(env: ApiEnv) -> None:
    h = {**env.auth("t-big"), "Content-Type": "application/json"}
    bodies = {
        "response_format": '{"prompt": "x", "response_format": ' + _schema_format(BIG) + "}",
        "top_p": '{"prompt": "x", "top_p": ' + BIG + "}",
        "logit_bias": '{"prompt": "x", "logit_bias": {"5": -' + BIG + "}}",
    }
    for param, raw in bodies.items():
        resp = env.client.post("/v1/jobs", content=raw, headers=h)
        assert resp.status_code == 400, (param, resp.text)
        error = resp.json()["error"]
        assert error["param"] == param and "finite" in error["message"], error
    ok = env.client.post("/v1/jobs", json={"prompt": "x", "max_tokens": 2}, headers=h)
    assert ok.status_code == 201, ok.text


def test_a_batch_line_with_1e400_is_that_lines_error(env: ApiEnv, worker) -> None:
    """One bad line among good ones: before, the chunk's insert was refused and retried
    every 5 s forever, the batch ``validating``. Now: 2 results and 1 error line."""
    h = env.auth("t-big-batch")

    def line(custom_id: str, description: str) -> str:
        return ('{"custom_id": "' + custom_id + '", "method": "POST", "url": "/v1/completions",'
                ' "body": {"prompt": "the quick brown fox", "max_tokens": 3, "temperature": 0,'
                ' "response_format": ' + _schema_format(description) + "}}")

    raw = jsonl([line("good-1", '"fine"'), line("bad", BIG), line("good-2", '"fine"')])
    up = env.client.post("/v1/files", files={"file": ("in.jsonl", raw, "application/jsonl")},
                         data={"purpose": "batch"}, headers=h)
    assert up.status_code == 200, up.text
    created = env.client.post("/v1/batches", json={"input_file_id": up.json()["id"],
                                                   "endpoint": "/v1/completions"}, headers=h)
    assert created.status_code == 200, created.text
    batch = wait_expanded(env, h, created.json()["id"])
    assert batch["status"] != "validating", batch

    def finished() -> bool:
        got = env.client.get(f"/v1/batches/{batch['id']}", headers=h).json()
        return got["status"] in ("completed", "failed", "expired", "cancelled")

    wait_for(finished, timeout=120, what="the batch to finish")
    done = env.client.get(f"/v1/batches/{batch['id']}", headers=h).json()
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    outputs = env.client.get(f"/v1/files/{done['output_file_id']}/content", headers=h).text
    assert [row["custom_id"] for row in read_jsonl(outputs)] == ["good-1", "good-2"]
    errors = env.client.get(f"/v1/files/{done['error_file_id']}/content", headers=h).text
    (error,) = read_jsonl(errors)
    assert error["custom_id"] == "bad"
    assert error["response"]["body"]["error"]["param"] == "response_format"
    assert "finite" in error["response"]["body"]["error"]["message"]


def test_batch_metadata_with_a_lone_surrogate_is_a_400(env: ApiEnv) -> None:
    """Before: a 500, and the next request on the same connection failed too."""
    h = env.auth("t-surrogate")
    up = env.client.post("/v1/files", files={"file": ("in.jsonl", b'{"prompt": "x"}\n',
                                                      "application/jsonl")},
                         data={"purpose": "batch"}, headers=h)
    assert up.status_code == 200, up.text
    raw = ('{"input_file_id": "' + up.json()["id"] + '", "endpoint": "/v1/completions", '
           '"metadata": {"k": "\\ud800"}}')
    resp = env.client.post("/v1/batches", content=raw,
                           headers={**h, "Content-Type": "application/json"})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_encoding", "metadata"), error
    after = env.client.get("/v1/batches", headers=h)  # the same connection still works
    assert after.status_code == 200 and after.json()["data"] == [], after.text


# ------------------------------------------------------------------ webhook secret


def test_a_read_only_key_cannot_read_the_webhook_secret(env: ApiEnv) -> None:
    from worker.store.crud.api_keys import create_api_key

    with env.ctx.session_factory.begin() as s:
        _, plain = create_api_key(session=s, tenant="t-ro-secret", read_only=True)
    ro = {"Authorization": f"Bearer {plain}"}
    for resp in (env.client.get("/v1/webhook_secret", headers=ro),
                 env.client.post("/v1/webhook_secret/rotate", headers=ro)):
        assert resp.status_code == 403, resp.text
        assert resp.json()["error"]["code"] == "permission_denied"
    rw = env.auth("t-ro-secret")
    assert env.client.get("/v1/webhook_secret", headers=rw).status_code == 200
    assert env.client.get("/v1/jobs", headers=ro).status_code == 200  # other reads still work


def test_two_rotations_at_once_both_succeed(env: ApiEnv) -> None:
    """Each rotation's first statement on the secrets table waits (up to 2 s) until the
    other's has run too, so both read "no secret yet" before either writes: the old
    read-then-insert answered 500 to one of them."""
    from sqlalchemy import event

    h = env.auth("t-rotate")
    barrier = threading.Barrier(2, timeout=2)
    seen = threading.local()

    def meet(conn, cursor, statement, parameters, context, executemany) -> None:
        if "webhook_secrets" in statement and not getattr(seen, "met", False):
            seen.met = True
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait()

    secrets: list[str] = []
    statuses: list[int] = []

    def rotate() -> None:
        resp = env.client.post("/v1/webhook_secret/rotate", headers=h)
        statuses.append(resp.status_code)
        if resp.status_code == 200:
            secrets.append(resp.json()["secret"])

    event.listen(env.ctx.engine, "after_cursor_execute", meet)
    try:
        threads = [threading.Thread(target=rotate) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        event.remove(env.ctx.engine, "after_cursor_execute", meet)
    assert statuses == [200, 200]
    final = env.client.get("/v1/webhook_secret", headers=h).json()["secret"]
    assert final in secrets and len(set(secrets)) == 2
