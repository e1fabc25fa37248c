"""OpenAI's own routes, so that any OpenAI client works unchanged:
``POST /v1/chat/completions`` and ``POST /v1/completions``.

Each request becomes one job in the ``interactive`` queue class through the same
submission path as ``POST /v1/jobs`` (:mod:`api.control.submit`: validation, limits, queue
backpressure, quotas, enqueue), and the answer waits for it (:mod:`api.job_waiter`):

- without ``stream``: OpenAI's ``chat.completion`` / ``text_completion`` object once the
  job's result is committed (the body ``GET /v1/jobs/{id}`` shows as ``result``);
- with ``stream: true``: Server-Sent Events in OpenAI's chunk format, fed by the text
  deltas the worker publishes as it produces tokens (each with the logprobs of its tokens,
  when asked), completed from the committed result (the text and logprobs not streamed,
  finish reasons, usage), then ``data: [DONE]``.

A client that goes away, and a wait longer than ``INFLIGHT_COMPLETION_TIMEOUT`` (504),
cancel the job, unless the request sent ``X-Inflight-Detach: true``: the job then runs on
and stays readable at ``GET /v1/jobs/{id}``. Every answer after the submission carries the
job's id in ``X-Inflight-Job-Id``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Body, Header, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from api.context import Context
from api.control.submit import Submission, submit_job
from api.deps import CtxDep, TenantDep
from api.errors import ApiError, error_response
from api.job_waiter import Ended, Stopped, TextDelta, job_events, read_job
from api.views import job_model, response_body, usage
from worker.jobs.cancel import request_cancel
from worker.protocol.openai_batch import (
    CHAT_ENDPOINT,
    COMPLETIONS_ENDPOINT,
    logprobs_from_stored,
    logprobs_object,
)
from worker.queue.job_events import DELTAS, END

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1", tags=["openai"])

JOB_ID_HEADER = "X-Inflight-Job-Id"
DETACH_HEADER = "X-Inflight-Detach"
_STREAM_OPTIONS = frozenset({"include_usage"})

_EXAMPLE_CHAT = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "Say hi"}],
                 "max_tokens": 16}
_EXAMPLE_COMPLETION = {"model": "smollm2-135m", "prompt": "Once upon a time", "max_tokens": 16}


@router.post("/chat/completions", operation_id="createChatCompletion")
async def chat_completions(
    *,
    request: Request,
    payload: Annotated[dict[str, Any], Body(examples=[_EXAMPLE_CHAT])],
    detach: str | None = Header(None, alias=DETACH_HEADER, max_length=16),
    idempotency_key: str | None = Header(None, alias="Idempotency-Key", max_length=255),
    ctx: CtxDep,
    tenant: TenantDep,
) -> Response:
    """OpenAI's Create chat completion: the ``chat.completion`` object, or with
    ``stream: true`` ``chat.completion.chunk`` events."""
    return await _serve(request, ctx, tenant, CHAT_ENDPOINT, payload, detach, idempotency_key)


@router.post("/completions", operation_id="createCompletion")
async def completions(
    *,
    request: Request,
    payload: Annotated[dict[str, Any], Body(examples=[_EXAMPLE_COMPLETION])],
    detach: str | None = Header(None, alias=DETACH_HEADER, max_length=16),
    idempotency_key: str | None = Header(None, alias="Idempotency-Key", max_length=255),
    ctx: CtxDep,
    tenant: TenantDep,
) -> Response:
    """OpenAI's Create completion (legacy): the ``text_completion`` object, or with
    ``stream: true`` its chunks."""
    return await _serve(request, ctx, tenant, COMPLETIONS_ENDPOINT, payload, detach, idempotency_key)


def _transport(body: dict[str, Any]) -> tuple[bool, bool]:
    """Take ``stream`` and ``stream_options`` out of the body (they shape the answer, not
    the job): (stream, include_usage). 400 for a value we cannot honour."""
    stream = body.pop("stream", None)
    options = body.pop("stream_options", None)
    if stream is not None and not isinstance(stream, bool):
        raise ApiError(400, f"stream must be true or false, got {stream!r}", code="invalid_value",
                       param="stream")
    if options is None:
        return bool(stream), False
    if not stream:
        raise ApiError(400, "stream_options is only allowed when stream is true",
                       code="invalid_value", param="stream_options")
    if not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", code="invalid_value",
                       param="stream_options")
    for name in options:
        if name not in _STREAM_OPTIONS:
            raise ApiError(400, f"stream_options.{name} is not supported; only include_usage is",
                           code="unsupported_field", param=f"stream_options.{name}")
    include_usage = options.get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise ApiError(400, "stream_options.include_usage must be true or false",
                       code="invalid_value", param="stream_options.include_usage")
    return True, bool(include_usage)


def _detached(value: str | None) -> bool:
    if value is None:
        return False
    flag = value.strip().lower()
    if flag in ("true", "1", "yes"):
        return True
    if flag in ("false", "0", "no", ""):
        return False
    raise ApiError(400, f"{DETACH_HEADER} must be true or false, got {value!r}",
                   code="invalid_value", param=DETACH_HEADER)


async def _serve(
    request: Request,
    ctx: Context,
    tenant: str,
    endpoint: str,
    payload: dict[str, Any],
    detach_header: str | None,
    idempotency_key: str | None,
) -> Response:
    body = dict(payload)
    stream, include_usage = _transport(body)
    detach = _detached(detach_header)
    sub = Submission(tenant=tenant, request=body, endpoint=endpoint, queue_class="interactive",
                     key_header=idempotency_key, events=DELTAS if stream else END)
    done = await run_in_threadpool(submit_job, ctx, sub)
    answer = _Answer(
        ctx=ctx,
        job_id=done.job.id,
        is_chat=endpoint == CHAT_ENDPOINT,
        model=job_model(done.job, body, ctx.settings.model_name),
        n=done.request.params.n,
        include_usage=include_usage,
        detach=detach,
        deadline=time.monotonic() + ctx.settings.completion_timeout,
    )
    headers = {JOB_ID_HEADER: done.job.id}
    if stream:
        return StreamingResponse(
            answer.events(request),
            media_type="text/event-stream",
            headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return await answer.whole(request, headers)


class _Answer:
    """What one request waits for and how it is answered."""

    def __init__(self, *, ctx: Context, job_id: str, is_chat: bool, model: str, n: int,
                 include_usage: bool, detach: bool, deadline: float) -> None:
        self.ctx, self.job_id, self.is_chat, self.model, self.n = ctx, job_id, is_chat, model, n
        self.include_usage, self.detach, self.deadline = include_usage, detach, deadline
        self.created = int(time.time())
        self.id = f"{'chatcmpl' if is_chat else 'cmpl'}-{job_id}"

    async def _cancel(self, why: str) -> None:
        """Cancel the job (the one-job cancel path), unless the request detached it."""
        if self.detach:
            return
        log.info("cancelling job %s: %s", self.job_id, why)
        with anyio.CancelScope(shield=True):
            try:
                await run_in_threadpool(
                    request_cancel,
                    session_factory=self.ctx.session_factory,
                    redis_client=self.ctx.redis,
                    keys=self.ctx.keys,
                    job_id=self.job_id,
                )
            except Exception:
                log.exception("could not cancel job %s", self.job_id)

    # -- without stream ------------------------------------------------------------------
    async def whole(self, request: Request, headers: dict[str, str]) -> Response:
        """Wait for the end; the OpenAI object, or an OpenAI error."""
        ended: Ended | None = None
        async for event in job_events(self.ctx, self.job_id, request=request,
                                      deadline=self.deadline):
            if isinstance(event, Ended):
                ended = event
            elif isinstance(event, Stopped):
                await self._cancel(event.why)
                if event.why == "timeout":
                    return _timeout_response(self.ctx, headers)
                return error_response(499, "the client closed the request", code="client_closed",
                                      headers=headers)
        assert ended is not None
        job = await run_in_threadpool(read_job, self.ctx, self.job_id)
        body = response_body(job, model_name=self.model) if job is not None else None
        if job is None or body is None:
            return _failure_response(job.status if job else "failed",
                                     job.error if job else None, headers)
        body["id"], body["created"] = self.id, self.created
        return JSONResponse(body, headers=headers)

    # -- stream --------------------------------------------------------------------------
    def _sse(self, obj: dict[str, Any]) -> str:
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

    def _chunk(self, choices: list[dict[str, Any]], *, usage_: Any = None) -> str:
        obj: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.is_chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            obj["usage"] = usage_
        return self._sse(obj)

    def _choice(self, index: int, text: str | None, *, role: bool = False,
                finish_reason: str | None = None, logprobs: Any = None) -> dict[str, Any]:
        if self.is_chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            return {"index": index, "delta": delta, "logprobs": logprobs,
                    "finish_reason": finish_reason}
        return {"index": index, "text": text or "", "logprobs": logprobs,
                "finish_reason": finish_reason}

    async def events(self, request: Request) -> AsyncIterator[str]:
        """The SSE body: a role chunk per choice (chat), content deltas as the worker
        publishes them (each with the logprobs of the tokens it completes, when asked), the
        rest of each choice's text and logprobs from the committed result, its finish
        reason, the usage chunk when asked, [DONE]."""
        complete = False
        try:
            if self.is_chat:
                yield self._chunk([self._choice(i, "", role=True) for i in range(self.n)])
            sent = [""] * self.n
            scored = [_Scored() for _ in range(self.n)]
            ended: Ended | None = None
            async for event in job_events(self.ctx, self.job_id, request=request,
                                          deadline=self.deadline):
                if isinstance(event, TextDelta):
                    i = event.index
                    if not 0 <= i < self.n or event.pos > len(sent[i]):
                        continue  # a gap (trimmed stream): the result completes the text
                    new = event.text[len(sent[i]) - event.pos :]
                    if new:
                        sent[i] += new
                        lp = scored[i].take(self.is_chat, event.lp_pos, event.logprobs)
                        yield self._chunk([self._choice(i, new, logprobs=lp)])
                elif isinstance(event, Ended):
                    ended = event
                elif event.why == "timeout":
                    yield self._sse({"error": _timeout_error(self.ctx)})
                    return
                else:
                    return  # disconnected: cancelled below
            job = await run_in_threadpool(read_job, self.ctx, self.job_id)
            body = response_body(job, model_name=self.model) if job is not None else None
            if job is None or body is None:
                status = job.status if job is not None else (ended.status if ended else "failed")
                yield self._sse({"error": _failure_error(status, job.error if job else None)})
                yield "data: [DONE]\n\n"
                complete = True
                return
            stored = job.choices or []
            for i, choice in enumerate(body["choices"][: self.n]):
                text = choice["message"]["content"] if self.is_chat else choice["text"]
                text = text or ""
                if not text.startswith(sent[i]):
                    log.warning("job %s choice %d: streamed text is not a prefix of the result",
                                self.job_id, i)
                rest = text[len(sent[i]) :]
                scores = stored[i].get("logprobs") if i < len(stored) else None
                lp = scored[i].rest(self.is_chat, scores) if choice.get("logprobs") else None
                if rest:
                    yield self._chunk([self._choice(i, rest, logprobs=lp)])
                    lp = None
                yield self._chunk([self._choice(i, None if self.is_chat else "",
                                                finish_reason=choice["finish_reason"],
                                                logprobs=lp)])
            if self.include_usage:
                yield self._chunk([], usage_=usage(job))
            yield "data: [DONE]\n\n"
            complete = True
        finally:
            if not complete:
                await self._cancel("the stream ended early (client gone or timeout)")


class _Scored:
    """The logprobs one streamed choice has sent: positions and characters of token text
    (a completion's ``text_offset`` goes on from there)."""

    def __init__(self) -> None:
        self.positions = 0
        self.chars = 0

    def take(self, is_chat: bool, lp_pos: int, stored: list[dict[str, Any]] | None
             ) -> dict[str, Any] | None:
        """The chunk's ``logprobs`` from a delta's scores at position ``lp_pos`` (None when
        the delta has none or some were missed: the final chunk sends them)."""
        if stored is None or lp_pos > self.positions:
            return None
        return self._send(is_chat, stored[self.positions - lp_pos :])

    def rest(self, is_chat: bool, stored: list[dict[str, Any]] | None) -> dict[str, Any] | None:
        """The result's scores not sent yet (None when none are left)."""
        return self._send(is_chat, (stored or [])[self.positions :])

    def _send(self, is_chat: bool, stored: list[dict[str, Any]]) -> dict[str, Any] | None:
        if not stored:
            return None
        infos = logprobs_from_stored(stored)
        obj = logprobs_object(is_chat, infos, self.chars)
        self.positions += len(infos)
        self.chars += sum(len(lp.token) for lp in infos)
        return obj


def _timeout_error(ctx: Context) -> dict[str, Any]:
    return {"message": f"the job did not finish within {ctx.settings.completion_timeout:g} s "
                       "(INFLIGHT_COMPLETION_TIMEOUT); it was cancelled unless detached",
            "type": "server_error", "param": None, "code": "timeout"}


def _timeout_response(ctx: Context, headers: dict[str, str]) -> JSONResponse:
    e = _timeout_error(ctx)
    return error_response(504, e["message"], code=e["code"], type=e["type"], headers=headers)


def _failure_error(status: str, error: str | None) -> dict[str, Any]:
    if status == "cancelled":
        return {"message": "the job was cancelled", "type": "invalid_request_error",
                "param": None, "code": "job_cancelled"}
    return {"message": error or f"the job ended {status}", "type": "server_error", "param": None,
            "code": "job_failed"}


def _failure_response(status: str, error: str | None, headers: dict[str, str]) -> JSONResponse:
    e = _failure_error(status, error)
    return error_response(409 if status == "cancelled" else 500, e["message"], code=e["code"],
                          type=e["type"], headers=headers)
