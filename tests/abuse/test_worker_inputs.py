"""Bad inputs beside good work, end to end on the tiny model: every bad body of the table
as a batch line (refused into the error file with its code and param) and as a raw
stream message read by the worker (failed alone with the parser's exact message), plus
unreadable stream entries (dead-lettered), while good and extreme-but-valid jobs run in
the same worker: the good ones end with the reference engine's text, and no engine step
fails."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from tests.abuse.cases import CASES, MAX_PROMPT_TOKENS, MAX_TOKENS_LIMIT
from tests.api.conftest import REDIS_URL, ApiEnv, jsonl, wait_expanded
from tests.jsonl import read_jsonl
from tests.service.helpers import only_lane, wait_for
from worker.protocol.openai_batch import RequestParseError, parse_request_body

pytestmark = pytest.mark.services

GOOD_PROMPTS = [f"good {i}: the quick brown fox" for i in range(6)]
ENGINE = {"model": "tiny-llama", "max_num_seqs": 16, "num_kv_blocks": 256, "max_model_len": 256,
          "attention_backend": "torch", "prepack_weights": False}
EXTREME = [  # accepted values at the edges of the limits: each must still succeed
    {"temperature": 100.0},
    {"temperature": 1e-4, "top_p": 1e-9},
    {"repetition_penalty": 0.01, "temperature": 0},
    {"repetition_penalty": 100.0, "temperature": 0},
    {"presence_penalty": 2.0, "frequency_penalty": -2.0, "temperature": 0.7},
    {"logit_bias": {"5": 100, "6": -100}, "temperature": 0},
    {"seed": (1 << 64) - 1, "temperature": 1.0, "min_p": 1.0},
    {"stop": ["\u00e9" * 256] * 16, "stop_token_ids": list(range(64))[10:], "temperature": 0},
    {"top_k": 1 << 20, "temperature": 0.5, "min_tokens": 4, "max_tokens": 4},
]
RAW_LINES: list[tuple[bytes, str | None, str]] = [  # (line, param, code) for undecodable lines
    (b'{"custom_id": "bad-utf8", "prompt": "\xff"}', None, "invalid_json"),
    (b"[" * 50_000 + b"]" * 50_000, None, "too_deep"),
    (b'{"custom_id": "nan", "prompt": "x", "temperature": NaN}', None, "invalid_json"),
    (b'{"custom_id": "ctl\\u0007", "prompt": "x"}', "custom_id", "invalid_value"),
]


def _batch_line(name: str, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"custom_id": name, "method": "POST", "url": endpoint, "body": body}


def _expected_parse_error(endpoint: str, body: dict[str, Any]) -> str:
    with pytest.raises(RequestParseError) as info:
        parse_request_body(body, endpoint=endpoint)
    return str(info.value)


def _reference_texts(prompts: list[str]) -> list[str]:
    from worker.engine import EngineArgs, LLMEngine
    from worker.protocol.sampling_params import SamplingParams

    engine = LLMEngine(EngineArgs(**ENGINE))
    params = SamplingParams(temperature=0, max_tokens=6)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), engine.tokenize(prompt=prompt), params)
    texts: dict[str, str] = {}
    while engine.has_unfinished_requests():
        outputs, _ = engine.step()
        texts.update({o.request_id: o.text for o in outputs if o.finished})
    return [texts[str(i)] for i in range(len(prompts))]


def test_bad_inputs_beside_good_jobs(make_env, caplog: pytest.LogCaptureFixture) -> None:
    from worker.queue.message import JobMessage
    from worker.queue.producer import publish
    from worker.service.config import WorkerConfig
    from worker.service.worker import WorkerProcess
    from worker.store.crud.job_status import create_jobs
    from worker.store.crud.jobs import get_job
    from worker.store.schemas import NewJob

    env: ApiEnv = make_env(max_prompt_tokens=MAX_PROMPT_TOKENS, max_tokens_limit=MAX_TOKENS_LIMIT)
    h = env.auth("tenant-mixed")
    c = env.client

    # 1. one batch file: good lines, every bad body of the table, undecodable lines
    good_lines = [
        _batch_line(f"good-{i}", "/v1/completions", {"prompt": p, "max_tokens": 6,
                                                      "temperature": 0})
        for i, p in enumerate(GOOD_PROMPTS)
    ]
    bad_cases = [case for case in CASES if not case.chat]
    lines = [*good_lines, *(_batch_line(case.name, case.endpoint, case.body())
                            for case in bad_cases)]
    raw = jsonl(lines) + b"".join(line + b"\n" for line, _, _ in RAW_LINES)
    up = c.post("/v1/files", files={"file": ("mixed.jsonl", raw, "application/jsonl")},
                data={"purpose": "batch"}, headers=h)
    assert up.status_code == 200, up.text
    created = c.post("/v1/batches", json={"input_file_id": up.json()["id"],
                                          "endpoint": "/v1/completions"}, headers=h).json()
    batch = wait_expanded(env, h, created["id"])  # the API answers validating, expands after
    n_bad = len(bad_cases) + len(RAW_LINES)
    assert batch["request_counts"] == {"total": len(good_lines) + n_bad, "completed": 0,
                                       "failed": n_bad}, batch

    # 2. extreme but valid jobs through the REST API
    extreme_ids = []
    for patch in EXTREME:
        body = {"prompt": "edge case", "max_tokens": 4, **patch}
        resp = c.post("/v1/jobs", json=body, headers=h)
        assert resp.status_code == 201, (patch, resp.text)
        extreme_ids.append(resp.json()["id"])

    # 3. raw stream messages: every bad body of the table (chat ones too), and entries
    # no worker can read; SQL holds a harmless placeholder, the stream the bad body
    stream_cases = [case for case in CASES if not case.api_only]
    placeholders = [NewJob(request={"url": "/v1/completions", "body": {"prompt": "x"}},
                           tenant="tenant-mixed", custom_id=f"stream-{case.name}")
                    for case in stream_cases]
    with env.ctx.session_factory.begin() as s:
        stream_ids = create_jobs(session=s, jobs=placeholders)
    publish(redis_client=env.ctx.redis, keys=env.ctx.keys, messages=[
        ("batch", JobMessage(job_id=job_id, tenant="tenant-mixed",
                             body={"url": case.endpoint, "body": case.body()}))
        for job_id, case in zip(stream_ids, stream_cases, strict=True)
    ])
    stream = only_lane(env.ctx.redis, env.ctx.keys)  # published in one go: one lane
    unreadable = [
        {"v": "1", "job_id": "raw-deep", "body": "[" * 100_000},
        {"v": "1", "job_id": "raw-array", "body": "[1, 2]"},
        {"v": "7", "job_id": "raw-version", "body": "{}"},
        {"v": "1", "body": "{}"},
    ]
    for fields in unreadable:
        env.ctx.redis.xadd(stream, fields)

    # 4. one worker runs everything
    config = WorkerConfig(
        database_url=env.settings.database_url, redis_url=REDIS_URL, model="tiny-llama",
        prefix=env.ctx.keys.prefix, name="abuse", heartbeat_interval=0.3,
        cancel_poll_interval=0.05, reconcile_interval=3600,
    )

    def engine_factory(_config: WorkerConfig) -> Any:
        from worker.engine import EngineArgs, LLMEngine

        return LLMEngine(EngineArgs(**ENGINE))

    batch_jobs = c.get("/v1/jobs", params={"batch_id": batch["id"], "limit": 100},
                       headers=h).json()["data"]
    everything = [j["id"] for j in batch_jobs] + extreme_ids + stream_ids

    def ended() -> bool:
        with env.ctx.session_factory() as s:
            return all(get_job(session=s, job_id=j).status not in ("queued", "running")
                       for j in everything)

    caplog.set_level(logging.WARNING)
    w = WorkerProcess(config, engine_factory=engine_factory, install_signals=False)
    t = threading.Thread(target=w.run)
    t.start()
    try:
        wait_for(ended, timeout=120, what="every job to end")
        wait_for(lambda: env.ctx.redis.xlen(env.ctx.keys.dead) >= len(unreadable), timeout=30,
                 what="the unreadable entries to be dead-lettered")
    finally:
        w.stop()
        t.join(60)
    assert not t.is_alive()
    assert not [r for r in caplog.records if "engine step failed" in r.getMessage()]
    assert w.loop is not None and not w.loop.isolation_busy()

    # good batch jobs: the reference engine's text; extreme ones: succeeded
    reference = _reference_texts(GOOD_PROMPTS)
    with env.ctx.session_factory() as s:
        got = {j["custom_id"]: get_job(session=s, job_id=j["id"]) for j in batch_jobs}
        for i in range(len(GOOD_PROMPTS)):
            job = got[f"good-{i}"]
            assert (job.status, job.text, job.completion_tokens) == (
                "succeeded", reference[i], 6), (job.status, job.error)
        for job_id, patch in zip(extreme_ids, EXTREME, strict=True):
            job = get_job(session=s, job_id=job_id)
            assert job.status == "succeeded" and job.completion_tokens >= 1, (patch, job.error)
        for job_id, case in zip(stream_ids, stream_cases, strict=True):
            job = get_job(session=s, job_id=job_id)
            expected = _expected_parse_error(case.endpoint, case.body())
            assert (job.status, job.error) == ("failed", expected), case.name

    # the batch ends; its error file names each bad line's code and param
    done = c.get(f"/v1/batches/{batch['id']}", headers=h).json()
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": len(good_lines) + n_bad,
                                      "completed": len(good_lines), "failed": n_bad}
    errors = read_jsonl(c.get(f"/v1/files/{done['error_file_id']}/content",
                                           headers=h).text)
    by_id = {e["custom_id"]: e for e in errors}
    for case in bad_cases:
        e = by_id[case.name]
        assert e["error"]["code"] == case.code, (case.name, e)
        assert e["response"]["body"]["error"]["param"] == case.param, (case.name, e)
    raw_errors = errors[len(bad_cases):]
    assert [(e["response"]["body"]["error"]["param"], e["error"]["code"]) for e in raw_errors] \
        == [(param, code) for _, param, code in RAW_LINES]
    outputs = read_jsonl(c.get(f"/v1/files/{done['output_file_id']}/content",
                                            headers=h).text)
    assert [o["response"]["body"]["choices"][0]["text"] for o in outputs] == reference
