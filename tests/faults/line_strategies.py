"""Hypothesis strategies for what the API accepts: ``POST /v1/jobs`` bodies (the job
fields drawn from the route's OpenAPI schema, the request fields from the grammar the
parser accepts: ``worker/protocol/openai_batch.py``) and OpenAI Batch input lines (both
line forms, with the invalid lines a careless tenant writes among them)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

TEXT = st.text(st.characters(codec="utf-8", categories=("L", "N", "P", "Zs")),
               min_size=1, max_size=24)
TOKEN_IDS = st.lists(st.integers(3, 300), min_size=1, max_size=12)


def from_property(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """A value of one OpenAPI property (the subset pydantic writes: ``anyOf`` with null,
    ``enum``, integers with bounds, strings with lengths)."""
    if "anyOf" in schema:
        return st.one_of(*(from_property(s) for s in schema["anyOf"]))
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        return st.integers(int(schema.get("minimum", -(2**31))), int(schema.get("maximum", 2**31)))
    if kind == "string":
        return st.text(st.characters(codec="ascii", categories=("L", "N")),
                       min_size=int(schema.get("minLength", 0)),
                       max_size=min(int(schema.get("maxLength", 32)), 32))
    raise ValueError(f"no strategy for {schema}")


def job_fields(openapi: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """The job fields of ``POST /v1/jobs`` (``JobCreate``'s own properties), each drawn
    from its schema or left out; ``endpoint`` and ``callback_url`` are the caller's, and
    ``dry_run`` makes no job (a quote: tests/api/test_estimates.py)."""
    props = openapi["components"]["schemas"]["JobCreate"]["properties"]
    return st.fixed_dictionaries({}, optional={
        name: from_property(schema) for name, schema in props.items()
        if name not in ("endpoint", "callback_url", "dry_run")})


def sampling(*, chat: bool, batch: bool) -> st.SearchStrategy[dict[str, Any]]:
    """Sampling fields within the ranges the parser accepts (``n`` > 1 only outside a
    batch, ``top_logprobs`` only in chat, where it needs ``logprobs``)."""
    optional: dict[str, st.SearchStrategy[Any]] = {
        "temperature": st.sampled_from([0, 0.0, 0.7, 1.0, 1.5]),
        "top_p": st.sampled_from([1, 0.9, 0.5, 1e-300]),
        "top_k": st.sampled_from([-1, 1, 5, 40]),
        "min_p": st.sampled_from([0.0, 0.1]),
        "seed": st.integers(0, 2**31 - 1),
        "presence_penalty": st.floats(-2, 2, allow_nan=False),
        "frequency_penalty": st.floats(-2, 2, allow_nan=False),
        "repetition_penalty": st.sampled_from([1.0, 1.2]),
        "stop": st.one_of(TEXT, st.lists(TEXT, max_size=3)),
        "ignore_eos": st.booleans(),
        "min_tokens": st.integers(0, 2),
        "logit_bias": st.dictionaries(st.integers(3, 300).map(str), st.integers(-100, 100),
                                      max_size=3),
        "skip_special_tokens": st.booleans(),
        "user": TEXT,
        "metadata": st.dictionaries(st.text("abcdef", min_size=1, max_size=8), TEXT,
                                    max_size=3),
        "guided_choice": st.lists(TEXT, min_size=1, max_size=3, unique=True),
    }
    if chat:
        optional["logprobs"] = st.booleans()
    else:
        optional["logprobs"] = st.integers(0, 3)
    if not batch:
        optional["n"] = st.integers(1, 2)
    return st.fixed_dictionaries({"max_tokens": st.integers(1, 4)}, optional=optional)


@st.composite
def body(draw: st.DrawFn, *, chat: bool, batch: bool) -> dict[str, Any]:
    """An OpenAI chat-completions or completions body."""
    fields = draw(sampling(chat=chat, batch=batch))
    if "guided_choice" in fields and draw(st.booleans()):
        del fields["guided_choice"]  # a grammar in half of the draws that picked one
    if chat:
        content = draw(st.one_of(TEXT, st.lists(
            st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), min_size=1,
            max_size=3)))
        messages = [{"role": "user", "content": content}]
        if draw(st.booleans()):
            messages.insert(0, {"role": "system", "content": draw(TEXT)})
        if fields.get("logprobs") is True and draw(st.booleans()):
            fields["top_logprobs"] = draw(st.integers(0, 5))
        return {"messages": messages, **fields}
    return {"prompt": draw(st.one_of(TEXT, TOKEN_IDS)), **fields}


BAD_LINES = (
    "{oops",
    "[1, 2]",
    '{"custom_id": "bad-num", "method": "POST", "url": "%s", "body": {"prompt": "x", '
    '"top_p": 1e400}}',
    '{"custom_id": "bad-field", "method": "POST", "url": "%s", "body": {"bogus": 1}}',
    '{"custom_id": "bad-url", "method": "POST", "url": "/v1/embeddings", "body": {}}',
    "not json at all",
)


@st.composite
def batch_input(draw: st.DrawFn, *, endpoint: str, max_line_bytes: int) -> list[str]:
    """The lines of a batch input file for ``endpoint``: accepted lines of both forms
    (unique custom_ids), with bad ones, a duplicate custom_id, blank lines and a line
    over the byte limit drawn in among them."""
    chat = endpoint == "/v1/chat/completions"
    n = draw(st.integers(1, 6))
    lines: list[str] = []
    for i in range(n):
        b = draw(body(chat=chat, batch=True))
        if draw(st.booleans()):
            line: dict[str, Any] = {"custom_id": f"c{i}", "method": "POST", "url": endpoint,
                                    "body": b}
        else:
            line = {**b, **({"custom_id": f"c{i}"} if draw(st.booleans()) else {})}
        lines.append(json.dumps(line, ensure_ascii=draw(st.booleans())))
    extras = draw(st.lists(st.sampled_from(["bad", "dup", "blank", "long"]), max_size=3))
    for extra in extras:
        at = draw(st.integers(0, len(lines)))
        if extra == "bad":
            text = draw(st.sampled_from(BAD_LINES))
            lines.insert(at, text % endpoint if "%s" in text else text)
        elif extra == "dup" and lines:
            lines.insert(at, lines[0] if '"custom_id"' in lines[0] else json.dumps(
                {"custom_id": "c0", "method": "POST", "url": endpoint,
                 "body": draw(body(chat=chat, batch=True))}))
        elif extra == "blank":
            lines.insert(at, "")
        elif extra == "long":
            lines.insert(at, json.dumps({"custom_id": "long", "prompt": "x" * max_line_bytes}))
    return lines
