"""LangChain's ``ChatOpenAI`` (langchain-openai), pointed at inflight with ``base_url``, against
the real API (uvicorn), a worker on the tiny model, Redis and PostgreSQL: ``invoke``,
``stream`` (with and without usage), ``astream``, ``n`` samples through ``generate``,
logprobs, structured output by JSON schema (its default method) and by JSON mode, and the
clear refusal of the tool-calling method. Nothing here reaches the network: LangSmith
tracing is off and nothing counts tokens with tiktoken."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any, Literal

import pytest

from tests.api.conftest import ApiEnv, tiny_worker

pytestmark = pytest.mark.services
langchain_openai = pytest.importorskip("langchain_openai")
pydantic = pytest.importorskip("pydantic")
messages = pytest.importorskip("langchain_core.messages")

QUESTION = [messages.SystemMessage("You answer briefly."),
            messages.HumanMessage("Write about the sea.")]


class Review(pydantic.BaseModel):
    """A labelled review (bounded, so that the tiny model's random text ends soon)."""

    label: Literal["pos", "neg"]
    score: int = pydantic.Field(ge=0, le=5)


@pytest.fixture
def worker(env: ApiEnv, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for name in ("LANGSMITH_TRACING", "LANGCHAIN_TRACING_V2", "LANGCHAIN_TRACING"):
        monkeypatch.setenv(name, "false")
    with tiny_worker(env, "langchain-compat") as w:
        yield w


def _chat(url: str, key: str, **kw: Any) -> Any:
    # no retries: a retried POST would be a second job
    return langchain_openai.ChatOpenAI(model="tiny-llama", base_url=f"{url}/v1", api_key=key,
                                       max_retries=0, timeout=120, **kw)


def _job(env: ApiEnv, key: str, job_id: str) -> dict[str, Any]:
    r = env.client.get(f"/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    return r.json()


def _stored_body(env: ApiEnv, job_id: str) -> dict[str, Any]:
    """The request body the job row keeps (what the client sent, less stream fields)."""
    from worker.protocol.openai_batch import split_stored
    from worker.store.models.job import Job

    with env.ctx.session_factory() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return split_stored(job.request)[1]


def test_chat_openai_invoke_stream_and_samples(env: ApiEnv, worker: Any) -> None:
    from api.serve_thread import ThreadedServer

    key = env.key("t-langchain")
    with ThreadedServer(env.app) as url:
        greedy = _chat(url, key, temperature=0, max_tokens=24)
        plain = greedy.invoke(QUESTION)
        assert isinstance(plain.content, str) and plain.content
        meta = plain.response_metadata
        assert meta["finish_reason"] in ("stop", "length") and meta["model_name"] == "tiny-llama"
        usage = plain.usage_metadata
        assert usage["output_tokens"] > 0 and usage["input_tokens"] > 0
        job = _job(env, key, meta["id"].removeprefix("chatcmpl-"))  # the job behind it
        assert job["status"] == "succeeded" and job["queue_class"] == "interactive"
        # max_tokens goes out as max_completion_tokens; it was honoured
        assert job["usage"]["completion_tokens"] == usage["output_tokens"] <= 24

        # streamed: the chunks add up to the same greedy text; usage only when asked
        chunks = list(greedy.stream(QUESTION))
        assert len(chunks) >= 3
        assert "".join(c.content for c in chunks) == plain.content
        assert all(c.usage_metadata is None for c in chunks)
        whole = None
        for c in greedy.stream(QUESTION, stream_usage=True):
            whole = c if whole is None else whole + c
        assert whole is not None and whole.content == plain.content
        assert whole.usage_metadata["output_tokens"] == usage["output_tokens"]
        assert whole.response_metadata["finish_reason"] == meta["finish_reason"]

        async def astreamed() -> str:
            return "".join([c.content async for c in greedy.astream(QUESTION)])

        assert asyncio.run(astreamed()) == plain.content

        # n samples: one request, n generations (LangChain streams only n=1)
        sampled = _chat(url, key, temperature=1.0, seed=3, n=2, max_tokens=8)
        result = sampled.generate([QUESTION])
        (generations,) = result.generations
        assert len(generations) == 2 and all(g.message.content for g in generations)
        again = sampled.generate([QUESTION]).generations[0]  # seeded: the same two samples
        assert [g.message.content for g in again] == [g.message.content for g in generations]

        scored = _chat(url, key, temperature=0, max_tokens=6, logprobs=True, top_logprobs=2)
        content = scored.invoke(QUESTION).response_metadata["logprobs"]["content"]
        assert 1 <= len(content) <= 6
        assert all(len(p["top_logprobs"]) == 2 and p["logprob"] <= 0 for p in content)


def test_chat_openai_structured_output(env: ApiEnv, worker: Any) -> None:
    from api.serve_thread import ThreadedServer

    key = env.key("t-langchain-structured")
    with ThreadedServer(env.app) as url:
        chat = _chat(url, key, temperature=1.0, seed=5, max_tokens=200)
        # the default method: response_format json_schema, parsed into the pydantic class
        review = chat.with_structured_output(Review).invoke(QUESTION)
        assert isinstance(review, Review)
        raw = chat.with_structured_output(Review, include_raw=True).invoke(QUESTION)
        assert raw["parsing_error"] is None and isinstance(raw["parsed"], Review)
        job_id = raw["raw"].response_metadata["id"].removeprefix("chatcmpl-")
        fmt = _stored_body(env, job_id)["response_format"]
        assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "Review"

        # JSON mode: a JSON object (seed 20: one the tiny model's random text closes)
        json_mode = _chat(url, key, temperature=1.0, seed=20, max_tokens=128).bind(
            response_format={"type": "json_object"})
        ask = [("user", "Reply with a JSON object.")]
        reply = json_mode.invoke(ask)
        assert reply.response_metadata["finish_reason"] == "stop"
        assert isinstance(json.loads(reply.content), dict)
        assert "".join(c.content for c in json_mode.stream(ask)) == reply.content  # seeded

        # tool calling is not served: a clear 400 naming the field, no job made
        from openai import BadRequestError

        with pytest.raises(BadRequestError) as bad:
            chat.with_structured_output(Review, method="function_calling").invoke(QUESTION)
        error = bad.value.body  # it sends tools and parallel_tool_calls: either is named
        assert error["param"] in ("tools", "parallel_tool_calls")
        assert error["code"] == "unsupported_field" and "tool calling" in error["message"]
