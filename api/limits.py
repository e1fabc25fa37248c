"""Request body size limit as an ASGI middleware (counts streamed bytes, not only the
Content-Length header), and request estimates used by the job limits."""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import ApiError
from worker.protocol.openai_batch import GenerationRequest
from worker.protocol.sampling_params import QUEUED_N_UNSUPPORTED


class BodyTooLarge(Exception):
    """Raised inside ``receive`` when the body passes the limit."""


class BodySizeLimit:
    """Answer 413 (OpenAI error shape) to bodies larger than the limit of their path:
    ``file_limit`` for ``/v1/files``, ``json_limit`` for everything else."""

    def __init__(self, app: ASGIApp, *, json_limit: int, file_limit: int) -> None:
        self.app = app
        self.json_limit = json_limit
        self.file_limit = file_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.file_limit if scope["path"].startswith("/v1/files") else self.json_limit
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > limit:
                    await _send_413(send, limit)
                    return
        seen = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge()
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await _send_413(send, limit)


async def _send_413(send: Send, limit: int) -> None:
    body = json.dumps(
        {
            "error": {
                "message": f"Request body is larger than the limit of {limit} bytes",
                "type": "invalid_request_error",
                "param": None,
                "code": "body_too_large",
            }
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def estimate_prompt_tokens(req: GenerationRequest) -> int:
    """Token count of the prompt: exact for token-id prompts, else an estimate of one
    token per 4 characters (the worker still refuses a prompt longer than its context)."""
    if isinstance(req.prompt, list):
        return len(req.prompt)
    if isinstance(req.prompt, str):
        return math.ceil(len(req.prompt) / 4)
    chars = 0
    for message in req.messages or []:
        chars += len(_text_of(message.get("content")))
    return math.ceil(chars / 4)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def check_request_limits(
    req: GenerationRequest, *, max_prompt_tokens: int, max_tokens_limit: int
) -> None:
    """Refuse what the queued service cannot serve (ApiError 400): ``n`` > 1, prompts and
    max_tokens beyond the configured bounds."""
    if req.params.n > 1:
        raise ApiError(
            400,
            f"n={req.params.n}: {QUEUED_N_UNSUPPORTED}",
            code="invalid_value",
            param="n",
        )
    est = estimate_prompt_tokens(req)
    if est > max_prompt_tokens:
        raise ApiError(
            400,
            f"prompt is too long: about {est} tokens, the limit is {max_prompt_tokens}",
            code="prompt_too_long",
            param="messages" if req.is_chat else "prompt",
        )
    max_tokens = req.params.max_tokens
    if max_tokens is not None and max_tokens > max_tokens_limit:
        param = "max_completion_tokens" if "max_completion_tokens" in req.body else "max_tokens"
        raise ApiError(
            400,
            f"{param}={max_tokens} is above the limit of {max_tokens_limit}",
            code="invalid_value",
            param=param,
        )
