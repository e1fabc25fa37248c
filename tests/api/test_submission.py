"""The one submission path (``api/control/submit.py``): ``POST /v1/jobs`` answers from the rows it
wrote, and a body and a batch line go through the same checks (``new_job``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.api.conftest import ApiEnv

CHAT = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8}


@pytest.fixture
def ctx() -> Iterator[Any]:
    """A context whose store and Redis are never reached (new_job writes nothing)."""
    from api.context import make_context
    from api.settings import Settings

    made = make_context(Settings(database_url="sqlite://", max_tokens_limit=100,
                                 max_prompt_tokens=1000, grammar_check=False,
                                 default_model="m"))  # no model lookup in the store
    yield made
    made.close()


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode()


def test_a_batch_line_gets_line_n_and_a_unique_custom_id(ctx: Any) -> None:
    from api.control.submit import LineError, Submission, new_job
    from worker.store.crud.jobs import keyed_job_id

    seen: set[str | None] = set()

    def take(n: int, obj: dict[str, Any]) -> Any:
        return new_job(ctx, Submission(tenant="t", request=_line(obj), line_no=n,
                                       queue_class="batch", batch_id="b-1"), seen).job

    first = take(1, {"prompt": "a", "max_tokens": 2})
    named = take(2, {"custom_id": "x", "prompt": "b", "max_tokens": 2})
    assert (first.custom_id, named.custom_id) == ("line-1", "x")
    assert first.batch_id == "b-1"
    assert (first.id, named.id) == (keyed_job_id("b-1", "line-1"), keyed_job_id("b-1", "x"))
    with pytest.raises(LineError) as dup:
        take(3, {"custom_id": "x", "prompt": "c"})
    assert dup.value.code == "duplicate_custom_id" and dup.value.custom_id == "x"
    assert str(dup.value) == ("line 3 (custom_id 'x'): duplicate custom_id 'x'; custom_id "
                              "must be unique within a batch")


def test_a_line_over_the_limits_is_its_error_record(ctx: Any) -> None:
    """The API's 400 for the same body, as the line's record: message naming the line,
    code and param, and the line's custom_id."""
    from api.control.submit import LineError, Submission, new_job

    with pytest.raises(LineError) as err:
        new_job(ctx, Submission(tenant="t", request=_line({"prompt": "a", "max_tokens": 101}),
                                line_no=4, batch_id="b"), set())
    e = err.value
    assert (e.message, e.code, e.param, e.custom_id) == (
        "line 4: max_tokens=101 is above the limit of 100", "invalid_value", "max_tokens",
        "line-4")


def test_a_body_over_the_limits_raises_the_api_error(ctx: Any) -> None:
    from api.control.submit import Submission, new_job
    from api.errors import ApiError

    with pytest.raises(ApiError) as err:
        new_job(ctx, Submission(tenant="t", request={"prompt": "a", "max_tokens": 101},
                                endpoint="/v1/completions"))
    assert err.value.status == 400 and err.value.message == (
        "max_tokens=101 is above the limit of 100")


def test_a_line_for_another_endpoint_is_refused(ctx: Any) -> None:
    from api.control.submit import LineError, Submission, new_job

    line = {"custom_id": "c", "method": "POST", "url": "/v1/completions",
            "body": {"prompt": "a"}}
    with pytest.raises(LineError) as err:
        new_job(ctx, Submission(tenant="t", request=_line(line), line_no=2,
                                endpoint="/v1/chat/completions", batch_id="b"), set())
    assert err.value.param == "url" and err.value.custom_id == "c"


@pytest.mark.services
def test_post_answers_from_the_rows_it_wrote(make_env: Any) -> None:
    """No job row is read back to answer a submission, and the answer is what GET shows."""
    from sqlalchemy import event

    env: ApiEnv = make_env(webhook_allow_hosts=("127.0.0.1",))
    h = env.auth("t-rows")
    body = {**CHAT, "custom_id": "c", "callback_url": "http://127.0.0.1:9/hook",
            "metadata": {"k": "v"}}
    reads: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        sql = " ".join(statement.split())
        if sql.startswith("SELECT") and ("FROM jobs" in sql or "FROM api_jobs" in sql) \
                and "count(" not in sql:  # the quota's count of open jobs is no read-back
            reads.append(sql)

    event.listen(env.ctx.engine, "before_cursor_execute", count)
    try:
        r = env.client.post("/v1/jobs", json=body, headers=h)
    finally:
        event.remove(env.ctx.engine, "before_cursor_execute", count)
    assert r.status_code == 201, r.text
    assert reads == []
    got = env.client.get(f"/v1/jobs/{r.json()['id']}", headers=h)
    assert r.json() == got.json()
    again = env.client.post("/v1/jobs", json=body, headers={**h, "Idempotency-Key": "k"})
    replay = env.client.post("/v1/jobs", json=body, headers={**h, "Idempotency-Key": "k"})
    assert replay.status_code == 200 and replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json() == again.json() == env.client.get(
        f"/v1/jobs/{again.json()['id']}", headers=h).json()
