"""OpenAI response bodies and OpenAI Batch output lines (standard library only).

Use through :mod:`worker.protocol.openai_batch`, which re-exports everything here.
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass, field
from typing import Any

LOGPROB_FLOOR = -9999.0
"""The logprob reported for a token of probability 0 (-inf) or an unusable score (NaN):
JSON has no -inf or NaN (PostgreSQL refuses them), and OpenAI reports -9999.0 for such
tokens."""


def finite_logprob(value: float) -> float:
    """``value`` itself when finite, else ``LOGPROB_FLOOR`` (-inf, NaN; +inf cannot be a
    log-probability either), so every stored or returned logprob is valid JSON."""
    return float(value) if math.isfinite(value) else LOGPROB_FLOOR


@dataclass
class LogprobInfo:
    """One generated position: its token text, log-probability and the top alternatives.

    The engine's TokenLogprob holds token ids; the caller, which has the tokenizer, turns
    them into text, so this module never needs one.
    """

    token: str
    logprob: float
    top: list[tuple[str, float]] = field(default_factory=list)


def new_request_id() -> str:
    """A fresh request id, ``req_`` plus 32 hex digits."""
    return f"req_{uuid.uuid4().hex}"


@dataclass
class Sample:
    """One sample of a request (choice 0, and 1, 2, ... when n > 1). ``token_ids`` and
    ``stop_reason`` (the stop string or token id that ended it) go into the choice when
    known, as vLLM's responses carry them."""

    text: str
    finish_reason: str | None
    logprobs: list[LogprobInfo] | None = None
    token_ids: list[int] | None = None
    stop_reason: str | int | None = None
    # the request's prompt scores (sample 0 only), vLLM's shape: None for the first prompt
    # token, then {token id: {"logprob", "rank", "decoded_token"}} per prompt token
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None


def logprob_info(lp: Any, decode: Any) -> LogprobInfo:
    """One engine ``TokenLogprob`` (token ids) named with ``decode`` (a tokenizer's), every
    logprob finite."""
    return LogprobInfo(token=decode([lp.token_id]), logprob=finite_logprob(lp.logprob),
                       top=[(decode([t]), finite_logprob(v)) for t, v in lp.top.items()])


def stored_logprobs(infos: list[LogprobInfo]) -> list[dict[str, Any]]:
    """Positions as JSON (the job store's and the streamed deltas' form)."""
    return [{"token": lp.token, "logprob": lp.logprob, "top": [list(t) for t in lp.top]}
            for lp in infos]


def logprobs_from_stored(stored: list[dict[str, Any]]) -> list[LogprobInfo]:
    """The positions :func:`stored_logprobs` wrote."""
    return [LogprobInfo(token=lp["token"], logprob=lp["logprob"],
                        top=[(str(t), float(v)) for t, v in lp.get("top", [])])
            for lp in stored]


def samples_of(out: Any, tokenizer: Any) -> list[Sample]:
    """Every sample of a finished engine output (``RequestOutput``: its ``samples`` when
    n > 1, else itself), naming logprob tokens with ``tokenizer.decode`` (needed only when
    the output carries logprobs; None otherwise). Every logprob comes out finite
    (:func:`finite_logprob`)."""

    def logprobs(entries: list[Any] | None) -> list[LogprobInfo] | None:
        if entries is None:
            return None
        if tokenizer is None:
            raise ValueError("logprobs need a tokenizer to name their tokens")
        return [logprob_info(lp, tokenizer.decode) for lp in entries]

    def prompt_scores(entries: list[Any] | None) -> list[dict[str, dict[str, Any]] | None] | None:
        if entries is None:
            return None
        if tokenizer is None:
            raise ValueError("prompt logprobs need a tokenizer to name their tokens")
        decode = tokenizer.decode

        def scored(lp: Any) -> dict[str, dict[str, Any]]:
            out = {str(lp.token_id): {"logprob": finite_logprob(lp.logprob), "rank": lp.rank,
                                      "decoded_token": decode([lp.token_id])}}
            for i, (t, v) in enumerate(lp.top.items()):  # the prompt token first, as vLLM
                out.setdefault(str(t), {"logprob": finite_logprob(v), "rank": i + 1,
                                        "decoded_token": decode([t])})
            return out

        return [None if lp is None else scored(lp) for lp in entries]

    samples = [Sample(text=o.text, finish_reason=o.finish_reason, logprobs=logprobs(o.logprobs),
                      token_ids=list(o.token_ids), stop_reason=getattr(o, "stop_reason", None))
               for o in (getattr(out, "samples", None) or [out])]
    samples[0].prompt_logprobs = prompt_scores(getattr(out, "prompt_logprobs", None))
    return samples


def stored_choice(sample: Sample) -> dict[str, Any]:
    """A sample as the job store keeps it (JSON; see :func:`choice_from_stored`)."""
    logprobs = None if sample.logprobs is None else stored_logprobs(sample.logprobs)
    stored: dict[str, Any] = {
        "text": sample.text,
        "finish_reason": sample.finish_reason,
        "stop_reason": sample.stop_reason,
        "token_ids": sample.token_ids,
        "logprobs": logprobs,
    }
    if sample.prompt_logprobs is not None:
        stored["prompt_logprobs"] = sample.prompt_logprobs
    return stored


def choice_from_stored(stored: dict[str, Any]) -> Sample:
    """The sample :func:`stored_choice` wrote."""
    logprobs = stored.get("logprobs")
    return Sample(
        text=stored.get("text") or "",
        finish_reason=stored.get("finish_reason"),
        logprobs=None if logprobs is None else logprobs_from_stored(logprobs),
        token_ids=stored.get("token_ids"),
        stop_reason=stored.get("stop_reason"),
        prompt_logprobs=stored.get("prompt_logprobs"),
    )


def build_response_body(
    *,
    is_chat: bool,
    request_id: str,
    model: str,
    choices: list[Sample],
    prompt_tokens: int,
    completion_tokens: int,
    created: int,
    with_logprobs: bool,
) -> dict[str, Any]:
    """The ``chat.completion`` (``is_chat``) or ``text_completion`` object of one finished
    request with its ``choices`` (every sample; ``completion_tokens`` counts all of them).
    Each choice's logprobs are included, in the endpoint's own format, only when the request
    asked for them (``with_logprobs``). Prompt scores, when asked, go where vLLM puts them:
    on the chat response, on each completion choice. Needs no parsed request: the job store
    serves its stored result through it as is."""
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
             "total_tokens": prompt_tokens + completion_tokens}
    bodies = [_choice(is_chat, with_logprobs, i, c) for i, c in enumerate(choices)]
    scores = choices[0].prompt_logprobs if choices else None
    if is_chat:
        body = {"id": f"chatcmpl-{request_id}", "object": "chat.completion", "created": created,
                "model": model, "choices": bodies, "usage": usage}
        return body if scores is None else {**body, "prompt_logprobs": scores}
    if scores is not None:
        bodies = [{**b, "prompt_logprobs": scores} for b in bodies]
    return {"id": f"cmpl-{request_id}", "object": "text_completion", "created": created,
            "model": model, "choices": bodies, "usage": usage}


def _choice(is_chat: bool, with_logprobs: bool, index: int, sample: Sample) -> dict[str, Any]:
    logprobs = sample.logprobs if with_logprobs else None
    known = {k: v for k, v in (("stop_reason", sample.stop_reason),
                               ("token_ids", sample.token_ids)) if v is not None}
    if is_chat:
        return {
            "index": index,
            "message": {"role": "assistant", "content": sample.text},
            "logprobs": logprobs_object(True, logprobs) if logprobs is not None else None,
            "finish_reason": sample.finish_reason,
            **known,
        }
    return {
        "index": index,
        "text": sample.text,
        "logprobs": logprobs_object(False, logprobs) if logprobs is not None else None,
        "finish_reason": sample.finish_reason,
        **known,
    }


def error_object(message: str, *, code: str | None = None, param: str | None = None,
                 type: str = "invalid_request_error") -> dict[str, Any]:
    """An OpenAI error object: ``{"message", "type", "param", "code"}``."""
    return {"message": message, "type": type, "param": param, "code": code}


def format_batch_output_line(
    *,
    custom_id: str | None,
    request_id: str,
    response_body: dict[str, Any] | None,
    status_code: int,
    error: dict[str, Any] | None,
) -> str:
    """One line of an OpenAI Batch output file, without the trailing newline.

    Shape: ``{"id": "batch_req_...", "custom_id", "response": {"status_code", "request_id",
    "body"}, "error"}``.
    """
    line = {
        "id": f"batch_req_{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "response": {"status_code": status_code, "request_id": request_id,
                     "body": response_body},
        "error": error,
    }
    return json.dumps(line, ensure_ascii=False)


def format_error_line(*, custom_id: str | None, request_id: str, message: str,
                      code: str = "invalid_request", param: str | None = None,
                      status_code: int = 400) -> str:
    """A failed request's output line: the error both in the response body (as the
    OpenAI API returns it) and in the line's ``error`` field (``{"code", "message"}``)."""
    error_type = "invalid_request_error" if status_code < 500 else "server_error"
    return format_batch_output_line(
        custom_id=custom_id,
        request_id=request_id,
        response_body={"error": error_object(message, code=code, param=param,
                                             type=error_type)},
        status_code=status_code,
        error={"code": code, "message": message},
    )


def logprobs_object(is_chat: bool, logprobs: list[LogprobInfo], text_offset: int = 0
                    ) -> dict[str, Any]:
    """A choice's (or a streamed chunk's) ``logprobs`` in the endpoint's own format; a
    completion's ``text_offset`` counts from ``text_offset`` (where the chunk's first token
    starts in the choice's text)."""
    return _chat_logprobs(logprobs) if is_chat else _completion_logprobs(logprobs, text_offset)


def _chat_logprobs(logprobs: list[LogprobInfo]) -> dict[str, Any]:
    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

    content = [{**entry(lp.token, lp.logprob),
                "top_logprobs": [entry(t, v) for t, v in lp.top]} for lp in logprobs]
    return {"content": content, "refusal": None}


def _completion_logprobs(logprobs: list[LogprobInfo], offset: int) -> dict[str, Any]:
    offsets = []
    for lp in logprobs:
        offsets.append(offset)
        offset += len(lp.token)
    return {
        "tokens": [lp.token for lp in logprobs],
        "token_logprobs": [lp.logprob for lp in logprobs],
        "top_logprobs": [dict(lp.top) for lp in logprobs],
        "text_offset": offsets,
    }
