"""A worker compiles each structured-output job's grammar on its intake thread, in the
grammar service's helper, bounded by ``WorkerConfig.grammar_timeout``: a job whose grammar
does not compile in time fails alone with a clear error, the jobs after it run, and the
engine thread compiles nothing (it gets the grammars precompiled). Tiny model, real
Redis and PostgreSQL; the API's own check is off so the slow constraint reaches the
worker."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.api.conftest import REDIS_URL, ApiEnv
from tests.engine.test_grammar_service import slow_schema
from tests.service.helpers import wait_for

pytestmark = pytest.mark.services

ENGINE = {"model": "tiny-llama", "max_num_seqs": 8, "num_kv_blocks": 128, "max_model_len": 256,
          "attention_backend": "torch", "prepack_weights": False}
SMALL = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
         "additionalProperties": False}


def test_a_job_whose_grammar_times_out_fails_alone_and_the_next_runs(make_env) -> None:
    from worker.service.config import WorkerConfig
    from worker.service.worker import WorkerProcess
    from worker.store.crud.jobs import get_job

    env: ApiEnv = make_env(grammar_check=False)
    c, h = env.client, env.auth("t-worker-grammar")
    bodies = {
        "slow": {"prompt": "x", "max_tokens": 8, "response_format": {
            "type": "json_schema", "json_schema": {"name": "slow", "schema": slow_schema()}}},
        "plain": {"prompt": "the quick brown fox", "max_tokens": 4, "temperature": 0},
        "small": {"prompt": "x", "max_tokens": 24, "temperature": 0, "response_format": {
            "type": "json_schema", "json_schema": {"name": "small", "schema": SMALL}}},
    }
    ids = {}
    for name, body in bodies.items():
        r = c.post("/v1/jobs", json=body, headers=h)
        assert r.status_code == 201, r.text
        ids[name] = r.json()["id"]

    compiled_on: list[str] = []

    def engine_factory(_config: WorkerConfig) -> Any:
        from worker.engine import EngineArgs, LLMEngine

        engine = LLMEngine(EngineArgs(**ENGINE))
        real = engine.grammars.compiled

        def compiled(spec: dict[str, Any]) -> Any:
            compiled_on.append(threading.current_thread().name)
            return real(spec)

        engine.grammars.compiled = compiled  # type: ignore[method-assign]
        return engine

    config = WorkerConfig(
        database_url=env.settings.database_url, redis_url=REDIS_URL, model="tiny-llama",
        prefix=env.ctx.keys.prefix, name="grammar-bounds", heartbeat_interval=0.3,
        cancel_poll_interval=0.05, reconcile_interval=3600, grammar_timeout=0.05,
    )

    def ended() -> bool:
        with env.ctx.session_factory() as s:
            return all(get_job(session=s, job_id=j).status not in ("queued", "running")
                       for j in ids.values())

    w = WorkerProcess(config, engine_factory=engine_factory, install_signals=False)
    t = threading.Thread(target=w.run)
    t.start()
    try:
        wait_for(ended, timeout=120, what="every job to end")
    finally:
        w.stop()
        t.join(60)
    assert not t.is_alive()
    with env.ctx.session_factory() as s:
        jobs = {name: get_job(session=s, job_id=j) for name, j in ids.items()}
    assert jobs["slow"].status == "failed", (jobs["slow"].status, jobs["slow"].text)
    assert "did not compile within 0.05s" in (jobs["slow"].error or ""), jobs["slow"].error
    assert jobs["plain"].status == "succeeded", jobs["plain"].error
    assert jobs["small"].status == "succeeded", jobs["small"].error
    assert jobs["small"].text.replace(" ", "") in ('{"ok":true}', '{"ok":false}'), jobs["small"].text
    assert compiled_on == ["intake"]  # the small grammar, once, never on the engine thread
