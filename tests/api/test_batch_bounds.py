"""Bounds on what one batch (or job) can make the API do: the bytes of one input line, the
number of lines (refused before anything is queued), the queue's bound and the tenant's
queued-jobs quota at creation, the text parts of a message, and a cap on max_tokens when
the request names none."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.conftest import ApiEnv, batch_lines, jsonl, wait_expanded
from tests.service.helpers import batch_length

pytestmark = pytest.mark.services


def _upload(env: ApiEnv, h: dict[str, str], data: bytes) -> str:
    r = env.client.post("/v1/files", data={"purpose": "batch"},
                        files={"file": ("in.jsonl", data, "application/jsonl")}, headers=h)
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


def _post_batch(env: ApiEnv, h: dict[str, str], file_id: str, endpoint: str = "/v1/completions"
                ) -> Any:
    return env.client.post("/v1/batches", json={"input_file_id": file_id, "endpoint": endpoint},
                           headers=h)


def _jobs_of(env: ApiEnv, batch_id: str) -> list[Any]:
    from sqlalchemy import select

    from worker.store.models import Job

    with env.ctx.session_factory() as s:
        return list(s.scalars(select(Job).where(Job.batch_id == batch_id).order_by(Job.id)))


def test_a_line_over_the_byte_limit_fails_alone(make_env) -> None:
    from api.control.staging import read_errors

    env = make_env(max_batch_line_bytes=300)
    h = env.auth("t-bounds-1")
    big = batch_lines(1, tag="big")[0]
    big["body"]["prompt"] = "x" * 5000
    fid = _upload(env, h, jsonl([batch_lines(1, tag="a")[0], big, batch_lines(1, tag="b")[0]]))
    r = _post_batch(env, h, fid)
    assert r.status_code == 200, r.text
    batch = wait_expanded(env, h, r.json()["id"])
    assert batch["request_counts"] == {"total": 3, "completed": 0, "failed": 1}
    assert sorted(j.custom_id for j in _jobs_of(env, batch["id"])) == ["a-0", "b-0"]
    errors = read_errors(env.ctx, batch["id"])
    assert list(errors) == [2]
    assert '"line_too_long"' in errors[2] and "over the limit of 300 bytes" in errors[2]


def test_too_many_lines_is_refused_at_creation(make_env) -> None:
    env = make_env(max_batch_lines=3)
    h = env.auth("t-bounds-2")
    r = _post_batch(env, h, _upload(env, h, jsonl(batch_lines(4))))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "too_many_lines"
    assert env.client.get("/v1/batches", headers=h).json()["data"] == []
    # three requests and trailing blank lines are within the limit
    r = _post_batch(env, h, _upload(env, h, jsonl(batch_lines(3)) + b"\n\n"))
    assert r.status_code == 200, r.text


def test_expansion_fails_an_oversized_file_before_queueing_anything(make_env) -> None:
    """A batch created under a higher limit (or before the API counted) fails at its first
    expansion with no job queued, not after a first chunk went out."""
    from api.control.expand import expand_batch
    from worker.store.crud.batches import create_batch

    env = make_env(expand_chunk=2)
    h = env.auth("t-bounds-3")
    fid = _upload(env, h, jsonl(batch_lines(5)))
    env.ctx.settings.max_batch_lines = 4
    with env.ctx.session_factory.begin() as s:
        batch = create_batch(session=s, tenant="t-bounds-3", endpoint="/v1/completions",
                             input_file_id=fid, completion_window="24h", metadata=None)
        batch_id = batch.id
    assert expand_batch(env.ctx, batch_id=batch_id) == "failed"
    assert _jobs_of(env, batch_id) == []
    assert batch_length(env.ctx.redis, env.ctx.keys) == 0
    got = env.client.get(f"/v1/batches/{batch_id}", headers=h).json()
    assert got["errors"]["data"][0]["code"] == "too_many_lines"


@pytest.mark.parametrize("status", ["cancelling", "cancelled", "completed", "failed"])
def test_a_failing_expansion_keeps_a_cancelling_or_ended_status(make_env, status: str) -> None:
    from api.control.expand import _fail
    from worker.store.crud.batches import create_batch, get_batch

    env = make_env()
    with env.ctx.session_factory.begin() as s:
        batch = create_batch(session=s, tenant="t-bounds-4", endpoint="/v1/completions",
                             input_file_id="file-x", completion_window="24h", metadata=None)
        batch.status = status
        batch_id = batch.id
    _fail(env.ctx, batch_id, "too_many_lines", "late")
    with env.ctx.session_factory() as s:
        after = get_batch(session=s, batch_id=batch_id)
        assert after is not None and after.status == status and not after.errors


def test_a_batch_counts_against_the_queued_jobs_quota_and_the_queue_bound(make_env) -> None:
    env = make_env(quota_queued_jobs=3)
    h = env.auth("t-bounds-5")
    r = _post_batch(env, h, _upload(env, h, jsonl(batch_lines(4))))
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "quota_exceeded" and int(r.headers["Retry-After"]) >= 1
    assert _post_batch(env, h, _upload(env, h, jsonl(batch_lines(3)))).status_code == 200

    env = make_env(max_queue_depth=3)
    h = env.auth("t-bounds-6")
    r = _post_batch(env, h, _upload(env, h, jsonl(batch_lines(4))))
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "queue_full" and int(r.headers["Retry-After"]) >= 1
    assert env.client.get("/v1/batches", headers=h).json()["data"] == []


CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def test_chat_without_max_tokens_gets_the_api_cap(make_env) -> None:
    """Without INFLIGHT_MAX_MODEL_LEN nothing else bounds such a job: the API writes
    max_tokens = INFLIGHT_MAX_TOKENS_LIMIT into it (jobs and batch lines alike)."""
    from worker.store.crud.jobs import get_job

    env = make_env(max_tokens_limit=77)
    h = env.auth("t-bounds-7")
    r = env.client.post("/v1/jobs", json=CHAT, headers=h)
    assert r.status_code == 201, r.text
    with env.ctx.session_factory() as s:
        job = get_job(session=s, job_id=r.json()["id"])
        assert job is not None and job.request["body"]["max_tokens"] == 77
    line = {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": CHAT}
    r = _post_batch(env, h, _upload(env, h, jsonl([line])), endpoint="/v1/chat/completions")
    assert r.status_code == 200, r.text
    wait_expanded(env, h, r.json()["id"])
    (job,) = _jobs_of(env, r.json()["id"])
    assert job.request["body"]["max_tokens"] == 77
    explicit = env.client.post("/v1/jobs", json={**CHAT, "max_tokens": 5}, headers=h).json()
    with env.ctx.session_factory() as s:
        got = get_job(session=s, job_id=explicit["id"])
        assert got is not None and got.request["body"]["max_tokens"] == 5

    env = make_env(max_tokens_limit=77, max_model_len=4096)  # the worker caps by context
    r = env.client.post("/v1/jobs", json=CHAT, headers=env.auth("t-bounds-8"))
    with env.ctx.session_factory() as s:
        job = get_job(session=s, job_id=r.json()["id"])
        assert job is not None and "max_tokens" not in job.request["body"]


def test_text_parts_are_counted_and_estimated_as_the_prompt_joins_them(env: ApiEnv) -> None:
    from api.limits import _text_of
    from worker.protocol.limits import LIMITS
    from worker.protocol.openai_content import parse_messages

    h = env.auth("t-bounds-9")
    parts = [{"type": "text", "text": ""}] * (LIMITS.max_content_parts + 1)
    r = env.client.post("/v1/jobs", json={"messages": [{"role": "user", "content": parts}],
                                         "max_tokens": 1}, headers=h)
    assert r.status_code == 400, r.text
    assert "parts; the limit is" in r.json()["error"]["message"]
    content = [{"type": "text", "text": "a"}, {"type": "text", "text": ""},
               {"type": "text", "text": "b"}]
    (parsed,) = parse_messages([{"role": "user", "content": content}])
    assert _text_of(content) == parsed["content"] == "a\n\nb"
