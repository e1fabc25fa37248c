"""Several models behind one API: which model a request runs on (``api.control.models``),
that the job carries it (its row, its stream, its answers), and batches of one model.

The rules are checked against a private SQLite store (the API tests' PostgreSQL is shared
by the session, so other tests' workers would count); the routes against the real API."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from tests.api.conftest import ApiEnv, batch_lines, jsonl, wait_expanded
from tests.service.helpers import batch_length
from worker.store.base import utcnow
from worker.store.crud.workers import heartbeat, register_worker
from worker.store.models import Worker
from worker.store.schemas import ModelInfo

pytestmark = pytest.mark.services

CHAT = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4}


def _register(ctx: Any, worker_id: str, model: str, *, age_s: float = 0.0,
              status: str = "running") -> None:
    """A worker row serving ``model``, its heartbeat ``age_s`` seconds old."""
    with ctx.session_factory.begin() as s:
        register_worker(session=s, worker_id=worker_id, host="h", model="spec", pid=1,
                        info=ModelInfo(model))
        heartbeat(session=s, worker_id=worker_id, status=status)
        s.flush()
        if age_s:
            s.get(Worker, worker_id).heartbeat_at = utcnow() - timedelta(seconds=age_s)


@pytest.fixture
def make_ctx(tmp_path) -> Iterator[Any]:
    """Factory: a context on a fresh migrated SQLite store (Redis is never reached)."""
    from api.context import make_context
    from api.settings import Settings
    from migrations.run import upgrade

    made: list[Any] = []

    def factory(**overrides: Any) -> Any:
        url = f"sqlite:///{tmp_path / f'm{len(made)}.db'}"
        upgrade(url=url)
        ctx = make_context(Settings(database_url=url, grammar_check=False, **overrides))
        ctx.models.ttl_s = 0.0  # every rule below sees the rows as they are now
        made.append(ctx)
        return ctx

    yield factory
    for ctx in made:
        ctx.close()


def _error(fn: Any) -> Any:
    from api.errors import ApiError

    with pytest.raises(ApiError) as info:
        fn()
    return info.value


def test_a_request_naming_no_model_runs_on_the_deployments_one_model(make_ctx) -> None:
    from api.control.models import resolve_model

    ctx = make_ctx()
    empty = _error(lambda: resolve_model(ctx, None))
    assert (empty.status, empty.code) == (404, "model_not_found")
    assert "INFLIGHT_DEFAULT_MODEL" in empty.message
    _register(ctx, "w-a", "model-a")
    _register(ctx, "w-old", "model-old", age_s=600, status="stopped")  # recent, not live
    assert resolve_model(ctx, None) == "model-a"  # the one live model wins
    _register(ctx, "w-b", "model-b")
    several = _error(lambda: resolve_model(ctx, None))
    assert (several.status, several.code, several.param) == (400, "model_required", "model")
    assert "'model-a'" in several.message and "'model-b'" in several.message
    assert resolve_model(ctx, "model-b") == "model-b"
    assert resolve_model(ctx, "model-old") == "model-old"  # served within the hour: queued
    assert make_ctx(default_model="model-b").settings.default_model == "model-b"


def test_a_model_no_worker_served_is_a_404_unless_declared_or_aliased(make_ctx) -> None:
    from api.control.models import resolve_model

    ctx = make_ctx(models=("planned",), model_aliases={"gpt-4o-mini": "model-a"})
    _register(ctx, "w-a", "model-a")
    _register(ctx, "w-gone", "model-gone", age_s=7200, status="stopped")  # over an hour ago
    for name in ("nope", "model-gone"):
        err = _error(lambda name=name: resolve_model(ctx, name))
        assert (err.status, err.code, err.param) == (404, "model_not_found", "model")
        assert "served now: 'model-a', 'planned'" in err.message
    assert resolve_model(ctx, "planned") == "planned"  # declared: queued for a worker to come
    assert resolve_model(ctx, "gpt-4o-mini") == "model-a"  # the operator's alias
    anything = make_ctx(model_aliases={"*": "model-a"})
    assert resolve_model(anything, "whatever-the-client-sends") == "model-a"
    assert make_ctx(default_model="d").settings.declared_models == {"d"}


def test_a_worker_that_just_registered_is_seen_at_once(make_ctx) -> None:
    """The known models are cached, but a name the cache lacks is looked up again."""
    from api.control.models import resolve_model

    ctx = make_ctx()
    ctx.models.ttl_s = 3600.0
    _register(ctx, "w-a", "model-a")
    assert resolve_model(ctx, "model-a") == "model-a"
    _register(ctx, "w-new", "model-new")
    assert resolve_model(ctx, "model-new") == "model-new"


def test_a_batch_line_runs_on_the_batch_model(make_ctx) -> None:
    from api.control.submit import LineError, Submission, new_job

    ctx = make_ctx()

    def line(body: dict[str, Any], n: int) -> Any:
        raw = json.dumps({"custom_id": f"c{n}", "method": "POST", "url": "/v1/completions",
                          "body": body}).encode()
        return new_job(ctx, Submission(tenant="t", request=raw, line_no=n, queue_class="batch",
                                       batch_id="b", model="model-a"), set()).job

    assert line({"prompt": "x"}, 1).model == "model-a"
    assert line({"prompt": "x", "model": "model-a"}, 2).model == "model-a"
    with pytest.raises(LineError) as other:
        line({"prompt": "x", "model": "model-b"}, 3)
    assert other.value.code == "model_mismatch" and other.value.param == "model"
    assert "every line of this batch runs on 'model-a'" in other.value.message


def test_the_job_carries_its_model_to_its_stream_and_its_answers(make_env) -> None:
    env: ApiEnv = make_env(models=("other",))
    h = env.auth("t-route")
    plain = env.client.post("/v1/jobs", json=CHAT, headers=h)
    assert plain.status_code == 201, plain.text
    assert plain.json()["model"] == "tiny-llama"  # no model named: the default
    named = env.client.post("/v1/jobs", json={**CHAT, "model": "other"}, headers=h)
    assert named.status_code == 201 and named.json()["model"] == "other"
    keys = env.ctx.keys
    other = [f["job_id"] for _, f in env.ctx.redis.xrange(keys.for_model("other").stream(
        "interactive"))]
    default = [f["job_id"] for _, f in env.ctx.redis.xrange(keys.stream("interactive"))]
    assert (other, default) == ([named.json()["id"]], [plain.json()["id"]])
    got = env.client.get(f"/v1/jobs/{named.json()['id']}", headers=h).json()
    assert got["model"] == "other"

    missing = env.client.post("/v1/jobs", json={**CHAT, "model": "nope"}, headers=h)
    assert missing.status_code == 404, missing.text
    assert missing.json()["error"]["code"] == "model_not_found"
    listed = env.client.get("/v1/jobs", headers=h).json()["data"]
    assert len(listed) == 2  # nothing was written for the refused one
    chat = env.client.post("/v1/chat/completions", json={**CHAT, "model": "nope"}, headers=h)
    assert chat.status_code == 404 and chat.json()["error"]["code"] == "model_not_found"


def _upload(env: ApiEnv, h: dict[str, str], lines: list[Any]) -> str:
    r = env.client.post("/v1/files", data={"purpose": "batch"},
                        files={"file": ("in.jsonl", jsonl(lines))}, headers=h)
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


def test_a_batch_is_of_one_model(make_env) -> None:
    env: ApiEnv = make_env(models=("other",))
    h = env.auth("t-route-batch")
    lines: list[Any] = batch_lines(3)
    lines[0]["body"]["model"] = "other"  # the first request names the batch's model
    lines[2]["body"]["model"] = "tiny-llama"  # another model: this line fails alone
    r = env.client.post("/v1/batches", json={"input_file_id": _upload(env, h, lines),
                                             "endpoint": "/v1/completions"}, headers=h)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "other"
    done = wait_expanded(env, h, r.json()["id"])
    assert done["request_counts"]["total"] == 3
    other = env.ctx.keys.for_model("other")
    assert batch_length(env.ctx.redis, other) == 2  # lines 1 and 2 (which names none)
    jobs = env.client.get(f"/v1/jobs?batch_id={done['id']}", headers=h).json()["data"]
    assert {j["model"] for j in jobs} == {"other"}
    from api.control.staging import read_errors

    (record,) = read_errors(env.ctx, done["id"]).values()  # the error file's line, until
    error = json.loads(record)["error"]  # the batch is finalized
    assert error["code"] == "model_mismatch" and "'other'" in error["message"]

    unknown: list[Any] = batch_lines(1)
    unknown[0]["body"]["model"] = "nope"
    r = env.client.post("/v1/batches", json={"input_file_id": _upload(env, h, unknown),
                                             "endpoint": "/v1/completions"}, headers=h)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    assert "the batch's first request" in r.json()["error"]["message"]
