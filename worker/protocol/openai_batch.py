"""OpenAI-style request lines in, OpenAI Batch output lines out (standard library only).

Shared by the engine CLI (``inflight generate``), the Redis enqueue command and the API.

Accepted input lines (one JSON object per line):

- OpenAI Batch input: ``{"custom_id", "method": "POST", "url", "body"}`` with ``url`` one of
  ``/v1/chat/completions`` and ``/v1/completions``;
- plain lines: ``{"prompt": ...}`` or ``{"messages": [...]}`` with the body's fields (sampling
  fields, ``model``...) at the top level and an optional ``custom_id``.

Every refusal is a :class:`RequestParseError` (an ``InvalidRequestError``) whose message says
which line, which request and which field, and what to do instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from worker.protocol.limits import (
    LIMITS,
    LimitError,
    check_id,
    check_json_value,
    check_metadata,
    check_short_string,
)
from worker.protocol.openai_content import is_int, json_type, parse_messages, parse_prompt
from worker.protocol.openai_errors import RequestParseError
from worker.protocol.openai_output import (
    LogprobInfo,
    Sample,
    build_response_body,
    choice_from_stored,
    error_object,
    format_batch_output_line,
    format_error_line,
    logprob_info,
    logprobs_from_stored,
    logprobs_object,
    new_request_id,
    samples_of,
    stored_choice,
    stored_logprobs,
)
from worker.protocol.sampling_params import InvalidRequestError, SamplingParams
from worker.protocol.structured_output import FIELDS as STRUCTURED_FIELDS
from worker.protocol.structured_output import structured_from_body

__all__ = [
    "CHAT_ENDPOINT",
    "COMPLETIONS_ENDPOINT",
    "ENDPOINTS",
    "GenerationRequest",
    "LogprobInfo",
    "RequestParseError",
    "Sample",
    "build_response_body",
    "choice_from_stored",
    "error_object",
    "format_batch_output_line",
    "format_error_line",
    "line_custom_id",
    "logprob_info",
    "logprobs_from_stored",
    "logprobs_object",
    "new_request_id",
    "parse_request_body",
    "parse_request_line",
    "samples_of",
    "split_stored",
    "stored_choice",
    "stored_logprobs",
]

CHAT_ENDPOINT = "/v1/chat/completions"
COMPLETIONS_ENDPOINT = "/v1/completions"
ENDPOINTS = (CHAT_ENDPOINT, COMPLETIONS_ENDPOINT)

# Body fields, by what happens to them.
_SAMPLING_FIELDS = frozenset({
    "max_tokens", "temperature", "top_p", "n", "stop", "seed", "presence_penalty",
    "frequency_penalty", "logprobs",
    # vLLM extras
    "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids",
    "skip_special_tokens", "logit_bias", "prompt_logprobs",
})
# Accepted and kept with the stored request: ``metadata`` and ``user`` are validated and
# returned on the job object; ``model`` picks the model the job runs on (the submission
# path's rules, api.control.models; GenerationRequest.model); ``stream`` must be false.
_KEPT_FIELDS = frozenset({"model", "user", "stream", "metadata"})
_CHAT_ONLY = frozenset({"messages", "max_completion_tokens", "top_logprobs"})
_COMPLETIONS_ONLY = frozenset({"prompt"})
# STRUCTURED_FIELDS (response_format, guided_regex, guided_choice): on both endpoints
_ALLOWED = {
    CHAT_ENDPOINT: _SAMPLING_FIELDS | _KEPT_FIELDS | _CHAT_ONLY | STRUCTURED_FIELDS,
    COMPLETIONS_ENDPOINT: _SAMPLING_FIELDS | _KEPT_FIELDS | _COMPLETIONS_ONLY | STRUCTURED_FIELDS,
}
# OpenAI fields this service refuses, and what to ask instead
_UNSUPPORTED = {
    "best_of": "ask for n samples with logprobs and keep the best (vLLM V1 dropped it too)",
    "echo": "the prompt is in the request; prompt_logprobs scores it",
    "suffix": "insertion is not supported by the served models",
}
# Tool calling (what LangChain's with_structured_output(method="function_calling") and
# agents send): refused as one thing, with the structured-output field to use instead.
_TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls", "functions", "function_call")
_UNSUPPORTED.update(dict.fromkeys(_TOOL_FIELDS, (
    "tool calling (tools, tool_choice, parallel_tool_calls, functions, function_call) is not "
    "served; for structured output send response_format with a json_schema (LangChain: "
    "with_structured_output(method=\"json_schema\"), its default)")))
_BATCH_LINE_KEYS = frozenset({"custom_id", "method", "url", "body"})
_INT_FIELDS = ("max_tokens", "max_completion_tokens", "n", "seed", "top_k", "min_tokens",
               "top_logprobs", "prompt_logprobs")
_BOOL_FIELDS = ("ignore_eos", "skip_special_tokens", "stream")
_COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's default for /v1/completions


@dataclass
class GenerationRequest:
    """One parsed request: what to generate (prompt or messages) and how (params).

    ``body`` is the original OpenAI request body, kept so the request can be stored and
    parsed again (``parse_request_body(req.body, endpoint=req.endpoint)``).
    """

    custom_id: str | None
    endpoint: str  # CHAT_ENDPOINT | COMPLETIONS_ENDPOINT
    prompt: str | list[int] | None
    messages: list[dict[str, Any]] | None
    params: SamplingParams
    model: str | None
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def is_chat(self) -> bool:
        """True for a /v1/chat/completions request."""
        return self.endpoint == CHAT_ENDPOINT

    def to_batch_input(self) -> dict[str, Any]:
        """The OpenAI Batch input line (as a dict) that parses back into this request."""
        return {"custom_id": self.custom_id, "method": "POST", "url": self.endpoint,
                "body": self.body}


def parse_request_line(line: str | bytes, *, line_number: int) -> GenerationRequest:
    """Parse one JSONL line (OpenAI Batch input or plain prompt/messages line).

    Raises RequestParseError carrying ``line_number`` and, when the line has one, its
    ``custom_id`` (so a caller can write the error line under the right id).
    """
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RequestParseError(f"not valid UTF-8 ({exc.reason} at byte {exc.start})",
                                    code="invalid_json", line_number=line_number) from None
    if not line.strip():
        raise RequestParseError("empty line; expected one JSON object", code="invalid_json",
                                line_number=line_number)
    try:
        obj = json.loads(line, parse_constant=_refuse_constant)
    except RecursionError:
        raise RequestParseError(
            f"JSON nested deeper than {LIMITS.max_json_depth} levels", code="too_deep",
            line_number=line_number) from None
    except json.JSONDecodeError as exc:
        raise RequestParseError(
            f"malformed JSON: {exc.msg} at column {exc.colno}; each line must be one "
            "complete JSON object", code="invalid_json", line_number=line_number) from None
    except _NonFiniteConstant as exc:
        raise RequestParseError(f"malformed JSON: {exc} is not valid JSON; numbers must be "
                                "finite", code="invalid_json", line_number=line_number) from None
    except ValueError as exc:  # an integer of more than 4300 digits (sys.int_info)
        reason = str(exc).split(";")[0]
        raise RequestParseError(f"malformed JSON: {reason}", code="invalid_json",
                                line_number=line_number) from None
    if not isinstance(obj, dict):
        raise RequestParseError(f"expected a JSON object, got {json_type(obj)}",
                                code="invalid_json", line_number=line_number)
    raw_id = obj.get("custom_id")
    custom_id = raw_id if _printable_id(raw_id) else None
    try:
        return _parse_object(obj)
    except RequestParseError as exc:
        raise exc.at(line_number=line_number, custom_id=custom_id) from None


def line_custom_id(line: bytes | None, *, line_number: int) -> str | None:
    """The custom_id a line's job has or would have (its own when printable, ``line-<n>``
    for an object naming none), without checking the rest of the line; None when the line
    is not a JSON object (or is None: too long to read)."""
    if line is None:
        return None
    try:
        obj = json.loads(line, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError included
        return None
    if not isinstance(obj, dict):
        return None
    raw_id = obj.get("custom_id")
    if raw_id is None:
        return f"line-{line_number}"
    return raw_id if _printable_id(raw_id) else None


def parse_request_body(body: dict[str, Any], *, endpoint: str) -> GenerationRequest:
    """Parse an OpenAI request body for ``endpoint`` (as the API receives it).

    ``custom_id`` is None; the caller sets it if it has one. Raises RequestParseError.
    """
    if endpoint not in ENDPOINTS:
        raise RequestParseError(
            f"url {endpoint!r} is not supported; expected one of {', '.join(ENDPOINTS)}",
            param="url", code="unsupported")
    if not isinstance(body, dict):
        raise RequestParseError(f"body must be a JSON object, got {json_type(body)}",
                                param="body")
    _check_fields(body, endpoint)
    with _as_parse_error():
        for name, value in body.items():  # non-finite numbers, lone surrogates, depth
            check_json_value(value, param=name)
        check_metadata(body.get("metadata"))
        check_short_string(body.get("user"), param="user", limit=LIMITS.max_user_chars)
        check_short_string(body.get("model"), param="model", limit=LIMITS.max_name_chars)
    _check_scalar_types(body)
    if body.get("stream"):
        raise RequestParseError(
            "stream=true is not supported for batch requests; remove it or set it to false",
            param="stream", code="unsupported")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestParseError(f"model must be a string, got {json_type(model)}",
                                param="model")
    prompt: str | list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    if endpoint == CHAT_ENDPOINT:
        messages = parse_messages(body.get("messages"))
    else:
        prompt = parse_prompt(body.get("prompt"))
    params = _sampling_params(body, endpoint)
    return GenerationRequest(custom_id=None, endpoint=endpoint, prompt=prompt,
                             messages=messages, params=params, model=model, body=body)


def split_stored(stored: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(endpoint, body) of a stored request: ``{"url", "body"}``, or a bare body whose
    ``messages`` / ``prompt`` says which endpoint it is for."""
    if isinstance(stored.get("body"), dict):
        return str(stored.get("url") or COMPLETIONS_ENDPOINT), stored["body"]
    return (CHAT_ENDPOINT if "messages" in stored else COMPLETIONS_ENDPOINT), stored


def _parse_object(obj: dict[str, Any]) -> GenerationRequest:
    custom_id = obj.get("custom_id")
    if custom_id is not None:
        with _as_parse_error():
            check_id(custom_id, param="custom_id")
    if {"url", "body", "method"} & obj.keys():
        unknown = sorted(obj.keys() - _BATCH_LINE_KEYS)
        if unknown:
            raise RequestParseError(
                f"unknown field {unknown[0]!r} in a batch line; a batch line has only "
                "custom_id, method, url and body (request fields go inside body)",
                param=unknown[0], code="unknown_field")
        if custom_id is None:
            raise RequestParseError("custom_id is required in a batch line",
                                    param="custom_id", code="missing_field")
        if obj.get("method") != "POST":
            raise RequestParseError(f"method must be \"POST\", got {obj.get('method')!r}",
                                    param="method")
        if not isinstance(obj.get("url"), str):
            raise RequestParseError(f"url is required in a batch line: one of "
                                    f"{', '.join(ENDPOINTS)}", param="url",
                                    code="missing_field")
        if "body" not in obj:
            raise RequestParseError("body is required in a batch line", param="body",
                                    code="missing_field")
        request = parse_request_body(obj["body"], endpoint=obj["url"])
    else:
        body = {k: v for k, v in obj.items() if k != "custom_id"}
        if "messages" in body and "prompt" in body:
            raise RequestParseError("give either prompt or messages, not both",
                                    param="messages")
        if "messages" in body:
            endpoint = CHAT_ENDPOINT
        elif "prompt" in body:
            endpoint = COMPLETIONS_ENDPOINT
        else:
            raise RequestParseError(
                "a line needs \"prompt\" (completion) or \"messages\" (chat), or the OpenAI "
                "Batch shape {custom_id, method, url, body}", code="missing_field")
        request = parse_request_body(body, endpoint=endpoint)
    request.custom_id = custom_id
    return request


def _check_fields(body: dict[str, Any], endpoint: str) -> None:
    allowed = _ALLOWED[endpoint]
    for name in body:
        if name in allowed:
            continue
        other = COMPLETIONS_ENDPOINT if endpoint == CHAT_ENDPOINT else CHAT_ENDPOINT
        if name in _ALLOWED[other]:
            hint = f"it is a {other} field"
            if name == "max_completion_tokens":
                hint += "; use max_tokens"
            raise RequestParseError(f"field {name!r} is not allowed for {endpoint}: {hint}",
                                    param=name, code="unknown_field")
        if name in _UNSUPPORTED:
            raise RequestParseError(f"{name} is not supported: {_UNSUPPORTED[name]}",
                                    param=name, code="unsupported_field")
        raise RequestParseError(f"unknown field {name!r} for {endpoint}", param=name,
                                code="unknown_field")


def _check_scalar_types(body: dict[str, Any]) -> None:
    for name in _INT_FIELDS:
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise RequestParseError(f"{name} must be an integer, got {value!r}", param=name)
    for name in _BOOL_FIELDS:
        value = body.get(name)
        if value is not None and not isinstance(value, bool):
            raise RequestParseError(f"{name} must be true or false, got {value!r}", param=name)
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str) and not (
            isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise RequestParseError(f"stop must be a string or a list of strings, got "
                                f"{json_type(stop)}",
                                param="stop")
    ids = body.get("stop_token_ids")
    if ids is not None and not (isinstance(ids, list) and all(is_int(t) for t in ids)):
        raise RequestParseError("stop_token_ids must be a list of integers",
                                param="stop_token_ids")
    bias = body.get("logit_bias")
    if bias is not None and not isinstance(bias, dict):
        raise RequestParseError("logit_bias must be an object of token id -> bias",
                                param="logit_bias")


def _sampling_params(body: dict[str, Any], endpoint: str) -> SamplingParams:
    values = {k: v for k, v in body.items() if k in _SAMPLING_FIELDS and v is not None}
    max_tokens_field = "max_tokens"
    mct = body.get("max_completion_tokens")
    if mct is not None:
        if "max_tokens" in values and values["max_tokens"] != mct:
            raise RequestParseError(
                "max_tokens and max_completion_tokens differ; give only one of them",
                param="max_completion_tokens")
        values["max_tokens"] = mct
        max_tokens_field = "max_completion_tokens"
    if endpoint == CHAT_ENDPOINT:
        values.pop("logprobs", None)
        top = body.get("top_logprobs")
        want = body.get("logprobs")
        if want is not None and not isinstance(want, bool):
            raise RequestParseError(f"logprobs must be true or false for {CHAT_ENDPOINT}, got "
                                    f"{want!r}", param="logprobs")
        if top is not None and not want:
            raise RequestParseError("top_logprobs requires logprobs=true", param="top_logprobs")
        if want:
            values["logprobs"] = top if top is not None else 0
    elif "logprobs" in values and not is_int(values["logprobs"]):
        raise RequestParseError(f"logprobs must be an integer for {COMPLETIONS_ENDPOINT}, got "
                                f"{values['logprobs']!r}", param="logprobs")
    if "max_tokens" not in values:
        values["max_tokens"] = (_COMPLETIONS_DEFAULT_MAX_TOKENS
                                if endpoint == COMPLETIONS_ENDPOINT else None)
    try:
        values["structured"] = structured_from_body(body)
        return SamplingParams.from_dict(values)
    except InvalidRequestError as exc:
        message = str(exc)
        param = getattr(exc, "param", None)
        if param == "max_tokens":
            param = max_tokens_field
            message = max_tokens_field + message[len("max_tokens"):]
        elif param == "logprobs" and endpoint == CHAT_ENDPOINT:
            param = "top_logprobs"
            message = "top_logprobs" + message[len("logprobs"):]
        raise RequestParseError(message, param=param, code="invalid_value") from None


@contextmanager
def _as_parse_error() -> Iterator[None]:
    """Turn a LimitError into the RequestParseError every parser here raises."""
    try:
        yield
    except LimitError as exc:
        raise RequestParseError(str(exc), param=exc.param, code=exc.code) from None


def _printable_id(value: object) -> bool:
    try:
        check_id(value, param="custom_id")
    except LimitError:
        return False
    return True


class _NonFiniteConstant(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NonFiniteConstant(name)
