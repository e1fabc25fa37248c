"""Request body size limit as an ASGI middleware (counts streamed bytes, not only the
Content-Length header), and request estimates used by the job limits."""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import ApiError
from worker.protocol.limits import prompt_token_upper_bound
from worker.protocol.openai_batch import GenerationRequest
from worker.protocol.openai_content import join_text_parts


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
        overflow = False

        async def counting_receive() -> Message:
            nonlocal seen, overflow
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    overflow = True
                    raise BodyTooLarge()
            return message

        async def tracking_send(message: Message) -> None:
            # A framework that turns the BodyTooLarge raised while it read the body into
            # its own error (FastAPI answers 400) still ends as our 413.
            nonlocal started
            if overflow:
                if message["type"] == "http.response.start" and not started:
                    started = True
                    await _send_413(send, limit)
                return
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


def prompt_token_bound(req: GenerationRequest) -> int:
    """Tokens the prompt can take at most: exact for token-id prompts, else the strict
    upper bound of :func:`prompt_token_upper_bound` (one token per UTF-8 byte plus the
    chat template), so nothing admitted here is too long for the model."""
    if isinstance(req.prompt, list):
        return len(req.prompt)
    if isinstance(req.prompt, str):
        return prompt_token_upper_bound(
            text_bytes=len(req.prompt.encode("utf-8")), num_messages=0
        )
    messages = req.messages or []
    size = sum(
        len(_text_of(m.get("content")).encode("utf-8")) + len(str(m.get("name") or "").encode())
        for m in messages
    )
    return prompt_token_upper_bound(text_bytes=size, num_messages=len(messages))


def _text_of(content: Any) -> str:
    """A message's prompt text: parsed messages hold it as a string already; a list of
    text parts is joined as the prompt joins it (:func:`join_text_parts`)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return join_text_parts(
            [str(p.get("text", "")) for p in content if isinstance(p, dict)]
        )
    return ""


def cap_max_tokens(
    req: GenerationRequest, *, max_tokens_limit: int, max_model_len: int | None
) -> None:
    """Give a request that names no ``max_tokens`` (chat; completions default to 16) the
    API's cap, ``max_tokens_limit``, when the model's context is not configured here: the
    worker would otherwise generate until the context is full. Written into the stored
    body (what the worker parses) and the parsed params alike."""
    if req.params.max_tokens is not None or max_model_len is not None:
        return
    req.body["max_tokens"] = max_tokens_limit
    req.params.max_tokens = max_tokens_limit


def check_request_limits(
    req: GenerationRequest,
    *,
    max_prompt_tokens: int,
    max_tokens_limit: int,
    max_model_len: int | None = None,
) -> None:
    """Refuse what the queued service cannot serve (ApiError 400): prompts and
    max_tokens beyond the configured bounds, and (when the served model's context
    ``max_model_len`` is configured) a prompt bound plus max_tokens that cannot fit.
    A request it admits without ``max_tokens`` and without ``max_model_len`` gets
    ``max_tokens_limit`` written into it (:func:`cap_max_tokens`)."""
    prompt_param = "messages" if req.messages is not None else "prompt"
    bound = prompt_token_bound(req)
    exact = isinstance(req.prompt, list)
    how = f"{bound} tokens" if exact else f"up to {bound} tokens (one per UTF-8 byte at most)"
    if bound > max_prompt_tokens:
        raise ApiError(
            400,
            f"prompt is too long: {how}, the limit is {max_prompt_tokens}",
            code="prompt_too_long",
            param=prompt_param,
        )
    max_tokens = req.params.max_tokens
    param = "max_completion_tokens" if "max_completion_tokens" in req.body else "max_tokens"
    if max_tokens is not None and max_tokens > max_tokens_limit:
        raise ApiError(
            400,
            f"{param}={max_tokens} is above the limit of {max_tokens_limit}",
            code="invalid_value",
            param=param,
        )
    if max_model_len is not None and bound + (max_tokens or 1) > max_model_len:
        raise ApiError(
            400,
            f"prompt ({how}) + {param} ({max_tokens or 1}) can exceed the model's context "
            f"of {max_model_len} tokens",
            code="prompt_too_long",
            param=prompt_param,
        )
    cap_max_tokens(req, max_tokens_limit=max_tokens_limit, max_model_len=max_model_len)
