"""``GET /v1/models`` and ``GET /v1/models/{model}``: the models of the live workers, from
the ``workers`` rows on the real PostgreSQL (the session's shared database: every id here
carries the test's unique prefix, and only those are looked at)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.api.conftest import ApiEnv
from worker.store.base import utcnow
from worker.store.crud.api_keys import create_api_key
from worker.store.crud.workers import heartbeat, register_worker
from worker.store.models import Worker
from worker.store.schemas import ModelInfo

pytestmark = pytest.mark.services


def _register(env: ApiEnv, worker_id: str, info: ModelInfo, *, age_s: float = 0.0) -> None:
    """A worker row as ``WorkerProcess.run`` writes it, its heartbeat ``age_s`` seconds old."""
    with env.ctx.session_factory.begin() as s:
        register_worker(session=s, worker_id=worker_id, host="h", model="spec", pid=1, info=info)
        heartbeat(session=s, worker_id=worker_id, status="running")
        if age_s:
            s.flush()
            row = s.get(Worker, worker_id)
            row.heartbeat_at = utcnow() - timedelta(seconds=age_s)


def _read_only(env: ApiEnv) -> dict[str, str]:
    with env.ctx.session_factory.begin() as s:
        _, plain = create_api_key(session=s, tenant="t-models", read_only=True)
    return {"Authorization": f"Bearer {plain}"}


def _is_error(resp, status: int, code: str) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["code"] == code, err
    return err


def test_models_of_live_workers_with_their_fields(env: ApiEnv) -> None:
    p = env.ctx.keys.prefix
    model = f"m-{p}"
    _register(env, f"a-{p}", ModelInfo(model, "llama", "LlamaForCausalLM", "float32", 2048))
    _register(env, f"b-{p}", ModelInfo(model, "llama", "LlamaForCausalLM", "float32", 1024))
    _register(env, f"c-{p}", ModelInfo(f"org/hub-{p}", "qwen2", "Qwen2ForCausalLM", "bfloat16", 512))
    _register(env, f"stale-{p}", ModelInfo(f"stale-{p}", "llama", None, "float32", 256), age_s=120)
    _register(env, f"stopped-{p}", ModelInfo(f"stopped-{p}"))
    with env.ctx.session_factory.begin() as s:
        heartbeat(session=s, worker_id=f"stopped-{p}", status="stopped")

    headers = _read_only(env)  # any valid key reads, a read-only one too
    r = env.client.get("/v1/models", headers=headers)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list"
    mine = {m["id"]: m for m in body["data"] if p in m["id"]}
    assert set(mine) == {model, f"org/hub-{p}"}  # neither the stale nor the stopped one
    m = mine[model]
    assert m["object"] == "model" and m["owned_by"] == "inflight"
    assert isinstance(m["created"], int) and isinstance(m["last_seen_at"], int)
    assert abs(m["last_seen_at"] - utcnow().timestamp()) < 60
    assert m["architecture"] == "LlamaForCausalLM" and m["model_type"] == "llama"
    assert m["dtype"] == "float32"
    assert m["max_model_len"] == 1024  # the smallest among its workers: fits every one
    assert m["num_workers"] == 2 and "workers" not in m  # worker ids name hosts: operators only
    assert mine[f"org/hub-{p}"]["num_workers"] == 1

    one = env.client.get(f"/v1/models/{model}", headers=headers)
    assert one.status_code == 200 and one.json() == m
    hub = env.client.get(f"/v1/models/org/hub-{p}", headers=headers)  # an id with a slash
    assert hub.status_code == 200 and hub.json()["dtype"] == "bfloat16"


def test_unknown_or_stale_model_is_404(env: ApiEnv) -> None:
    p = env.ctx.keys.prefix
    _register(env, f"stale-{p}", ModelInfo(f"stale-{p}"), age_s=120)
    headers = env.auth("t-models")
    for model in (f"nope-{p}", f"stale-{p}", "x" * 300):
        err = _is_error(env.client.get(f"/v1/models/{model}", headers=headers), 404, "model_not_found")
        assert err["param"] == "model" and err["type"] == "not_found_error"


def test_models_need_a_key(env: ApiEnv) -> None:
    _is_error(env.client.get("/v1/models"), 401, "invalid_api_key")
    _is_error(env.client.get("/v1/models/x", headers={"Authorization": "Bearer nope"}), 401,
              "invalid_api_key")


def test_a_worker_registered_without_model_info_counts_under_its_spec(env: ApiEnv) -> None:
    """A row without model info (the API's older callers, or a worker from before revision
    0008 whose columns are NULL) is listed under its ``--model`` spec."""
    p = env.ctx.keys.prefix
    with env.ctx.session_factory.begin() as s:
        register_worker(session=s, worker_id=f"old-{p}", host="h", model=f"spec-{p}", pid=1)
        s.flush()
        s.get(Worker, f"old-{p}").model_id = None
    r = env.client.get(f"/v1/models/spec-{p}", headers=env.auth("t-models"))
    assert r.status_code == 200, r.text
    assert r.json()["num_workers"] == 1 and r.json()["dtype"] is None
