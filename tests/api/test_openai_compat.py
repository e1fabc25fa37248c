"""OpenAI's own routes (``POST /v1/chat/completions``, ``POST /v1/completions``) driven by
the official ``openai`` SDK against the real API (uvicorn), a worker on the tiny model,
Redis and PostgreSQL: plain, streamed (the deltas add up to the greedy text), n, logprobs,
structured output, usage in the stream, a disconnect that cancels its job, a detached
stream that runs on, and the refusals (unsupported fields, queue full, timeout, key)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.api.conftest import ApiEnv, tiny_worker

pytestmark = pytest.mark.services
openai = pytest.importorskip("openai")

MESSAGES = [{"role": "user", "content": "Write about the sea."}]


@pytest.fixture
def worker(env: ApiEnv) -> Iterator[Any]:
    with tiny_worker(env, "openai-compat") as w:
        yield w


def _client(url: str, key: str, **kw: Any) -> Any:
    # no retries: a retried POST would be a second job
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120, **kw)


def _job(env: ApiEnv, headers: dict[str, str], job_id: str) -> dict[str, Any]:
    r = env.client.get(f"/v1/jobs/{job_id}", headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


def _wait_status(env: ApiEnv, headers: dict[str, str], job_id: str, statuses: set[str],
                 timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = _job(env, headers, job_id)
        if job["status"] in statuses or time.monotonic() > deadline:
            return job
        time.sleep(0.05)


def test_chat_completions_with_the_openai_sdk(env: ApiEnv, worker: Any) -> None:
    from api.serve_thread import ThreadedServer

    key = env.key("t-openai")
    headers = {"Authorization": f"Bearer {key}"}
    schema = {"type": "object",
              "properties": {"label": {"enum": ["pos", "neg"]},
                             "score": {"type": "integer", "minimum": 0, "maximum": 5}},
              "required": ["label", "score"], "additionalProperties": False}
    with ThreadedServer(env.app) as url:
        client = _client(url, key)
        plain = client.chat.completions.create(
            model="tiny-llama", messages=MESSAGES, max_tokens=24, temperature=0,
            user="u-1", metadata={"k": "v"})
        assert plain.object == "chat.completion" and plain.model == "tiny-llama"
        assert plain.id.startswith("chatcmpl-") and plain.created > 0
        (choice,) = plain.choices
        assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
        assert plain.usage.completion_tokens > 0 and plain.usage.prompt_tokens > 0
        assert plain.usage.total_tokens == plain.usage.prompt_tokens + plain.usage.completion_tokens
        job_id = plain.id.removeprefix("chatcmpl-")
        job = _job(env, headers, job_id)  # the same job the job API shows
        assert job["status"] == "succeeded" and job["queue_class"] == "interactive"
        assert job["user"] == "u-1" and job["metadata"] == {"k": "v"}
        assert job["result"]["choices"][0]["message"]["content"] == choice.message.content

        # streamed: a role chunk, content deltas, a finish chunk, the usage chunk, [DONE]
        chunks = list(client.chat.completions.create(
            model="tiny-llama", messages=MESSAGES, max_tokens=24, temperature=0, stream=True,
            stream_options={"include_usage": True}))
        assert all(c.object == "chat.completion.chunk" for c in chunks)
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == choice.message.content  # greedy: the same text, streamed
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert finishes[-1] == choice.finish_reason and not any(finishes[:-1])
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == (
            plain.usage.completion_tokens)
        assert all(c.usage is None for c in chunks[:-1])
        streamed_id = chunks[0].id.removeprefix("chatcmpl-")
        # the worker published the text as it produced it (several deltas), then the end
        events = env.ctx.redis.xrange(env.ctx.keys.deltas(streamed_id))
        deltas = [f for _, f in events if f["t"] == "d"]
        assert len(deltas) >= 2 and events[-1][1] == {"t": "end", "s": "succeeded"}
        assert "".join(f["x"] for f in deltas) == text[: len("".join(f["x"] for f in deltas))]

        two = client.chat.completions.create(
            model="tiny-llama", messages=MESSAGES, max_tokens=8, temperature=1.0, seed=3, n=2)
        assert [c.index for c in two.choices] == [0, 1]
        streamed_two = list(client.chat.completions.create(
            model="tiny-llama", messages=MESSAGES, max_tokens=8, temperature=1.0, seed=3, n=2,
            stream=True))
        for i in (0, 1):  # seeded: each streamed sample is the sample of the plain request
            parts = [c.choices[0].delta.content or "" for c in streamed_two
                     if c.choices and c.choices[0].index == i]
            assert "".join(parts) == two.choices[i].message.content

        scored = client.chat.completions.create(
            model="tiny-llama", messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True,
            top_logprobs=2)
        content = scored.choices[0].logprobs.content
        assert len(content) == scored.usage.completion_tokens
        assert all(len(p.top_logprobs) == 2 and p.logprob <= 0 for p in content)
        streamed_scored = list(client.chat.completions.create(
            model="tiny-llama", messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True,
            top_logprobs=2, stream=True))
        streamed_lp = [p for c in streamed_scored if c.choices and c.choices[0].logprobs
                       for p in c.choices[0].logprobs.content]
        assert [(p.token, p.logprob) for p in streamed_lp] == [(p.token, p.logprob) for p in content]
        # the scores arrive with the text of their tokens, as OpenAI streams them
        assert sum(1 for c in streamed_scored if c.choices and c.choices[0].logprobs
                   and c.choices[0].delta.content) >= 2

        fmt = {"type": "json_schema", "json_schema": {"name": "review", "schema": schema}}
        structured = client.chat.completions.create(
            model="tiny-llama", messages=MESSAGES, max_tokens=96, temperature=1.0, seed=5,
            response_format=fmt)
        value = json.loads(structured.choices[0].message.content)
        assert set(value) == {"label", "score"} and value["label"] in ("pos", "neg")
        streamed_structured = "".join(
            c.choices[0].delta.content or "" for c in client.chat.completions.create(
                model="tiny-llama", messages=MESSAGES, max_tokens=96, temperature=1.0, seed=5,
                response_format=fmt, stream=True) if c.choices)
        assert json.loads(streamed_structured) == value  # seeded: the same object, streamed

        stopped = client.chat.completions.create(
            model="tiny-llama", messages=MESSAGES, max_tokens=24, temperature=0,
            stop=[choice.message.content[3:6]] if len(choice.message.content) > 6 else None)
        streamed_stop = "".join(
            c.choices[0].delta.content or "" for c in client.chat.completions.create(
                model="tiny-llama", messages=MESSAGES, max_tokens=24, temperature=0,
                stop=[choice.message.content[3:6]] if len(choice.message.content) > 6 else None,
                stream=True) if c.choices)
        assert streamed_stop == stopped.choices[0].message.content


def test_completions_with_the_openai_sdk(env: ApiEnv, worker: Any) -> None:
    from api.serve_thread import ThreadedServer

    with ThreadedServer(env.app) as url:
        client = _client(url, env.key("t-openai-cmpl"))
        plain = client.completions.create(model="tiny-llama", prompt="Once upon a time",
                                          max_tokens=12, temperature=0, logprobs=2)
        assert plain.object == "text_completion" and plain.id.startswith("cmpl-")
        assert len(plain.choices[0].logprobs.tokens) == plain.usage.completion_tokens
        assert all(1 <= len(t) <= 2 for t in plain.choices[0].logprobs.top_logprobs)
        chunks = list(client.completions.create(model="tiny-llama", prompt="Once upon a time",
                                                max_tokens=12, temperature=0, stream=True))
        assert all(c.object == "text_completion" for c in chunks)
        assert "".join(c.choices[0].text for c in chunks) == plain.choices[0].text
        assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason
        scored = [c.choices[0].logprobs for c in client.completions.create(
            model="tiny-llama", prompt="Once upon a time", max_tokens=12, temperature=0,
            logprobs=2, stream=True) if c.choices[0].logprobs]
        assert len(scored) >= 2  # per chunk; offsets go on across chunks
        want = plain.choices[0].logprobs
        assert [t for lp in scored for t in lp.tokens] == want.tokens
        assert [o for lp in scored for o in lp.text_offset] == want.text_offset
        assert [v for lp in scored for v in lp.token_logprobs] == want.token_logprobs

        two = client.completions.create(model="tiny-llama", prompt="Once upon a time",
                                        max_tokens=8, temperature=1.0, seed=4, n=2)
        assert [c.index for c in two.choices] == [0, 1]
        streamed_two = list(client.completions.create(
            model="tiny-llama", prompt="Once upon a time", max_tokens=8, temperature=1.0, seed=4,
            n=2, stream=True))
        for i in (0, 1):  # seeded: each streamed sample is the sample of the plain request
            assert "".join(c.choices[0].text for c in streamed_two
                           if c.choices[0].index == i) == two.choices[i].text


def test_disconnect_cancels_unless_detached(env: ApiEnv, worker: Any) -> None:
    from api.serve_thread import ThreadedServer

    key = env.key("t-openai-gone")
    headers = {"Authorization": f"Bearer {key}"}
    long = {"model": "tiny-llama", "messages": MESSAGES, "max_tokens": 450, "temperature": 0,
            "extra_body": {"ignore_eos": True}}
    with ThreadedServer(env.app) as url:
        client = _client(url, key)
        stream = client.chat.completions.create(stream=True, **long)
        first = next(iter(stream))
        job_id = first.id.removeprefix("chatcmpl-")
        stream.close()  # the client goes away mid-stream
        job = _wait_status(env, headers, job_id, {"cancelled", "succeeded", "failed"})
        assert job["status"] == "cancelled", job
        assert (job["usage"] or {}).get("completion_tokens", 0) < 450

        raw = client.chat.completions.with_raw_response.create(
            stream=True, extra_headers={"X-Inflight-Detach": "true"},
            **{**long, "max_tokens": 120})
        kept = raw.headers["X-Inflight-Job-Id"]
        detached = raw.parse()
        assert next(iter(detached)).id == f"chatcmpl-{kept}"
        detached.close()
        job = _wait_status(env, headers, kept, {"cancelled", "succeeded", "failed"})
        assert job["status"] == "succeeded" and job["usage"]["completion_tokens"] == 120


def test_refusals(make_env: Any) -> None:
    """No worker: what is refused before a job exists, and a wait that times out."""
    from api.serve_thread import ThreadedServer

    env = make_env(completion_timeout=1.0, max_queue_depth=2, models=("m",))  # declared: queued
    key = env.key("t-openai-no")
    headers = {"Authorization": f"Bearer {key}"}
    with ThreadedServer(env.app) as url:
        client = _client(url, key)
        with pytest.raises(openai.BadRequestError) as bad:
            client.chat.completions.create(
                model="m", messages=MESSAGES,
                tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
        assert bad.value.body["param"] == "tools"
        assert bad.value.body["code"] == "unsupported_field"
        with pytest.raises(openai.BadRequestError) as bad:
            client.completions.create(model="m", prompt="x", best_of=2)
        assert bad.value.body["code"] == "unsupported_field"
        with pytest.raises(openai.BadRequestError) as bad:
            client.chat.completions.create(model="m", messages=MESSAGES, stream=True,
                                           stream_options={"include_obfuscation": True})
        assert bad.value.body["param"] == "stream_options.include_obfuscation"
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="m", messages=MESSAGES, temperature=-1)
        with pytest.raises(openai.AuthenticationError):
            _client(url, "ifk_wrong").chat.completions.create(model="m", messages=MESSAGES)

        # nothing serves the queue: the wait times out (504) and cancels the job
        with pytest.raises(openai.APIStatusError) as late:
            client.chat.completions.create(model="m", messages=MESSAGES)
        assert late.value.status_code == 504 and late.value.body["code"] == "timeout"
        job_id = late.value.response.headers["X-Inflight-Job-Id"]
        assert _job(env, headers, job_id)["status"] == "cancelled"

        # a detached one stays queued; the stream is full now (two entries, the bound): 429
        with pytest.raises(openai.APIStatusError) as late:
            client.chat.completions.create(model="m", messages=MESSAGES,
                                           extra_headers={"X-Inflight-Detach": "true"})
        assert late.value.status_code == 504
        kept = late.value.response.headers["X-Inflight-Job-Id"]
        assert _job(env, headers, kept)["status"] == "queued"
        with pytest.raises(openai.RateLimitError) as full:
            client.chat.completions.create(model="m", messages=MESSAGES)
        assert full.value.body["code"] == "queue_full"
        assert int(full.value.response.headers["Retry-After"]) >= 1
