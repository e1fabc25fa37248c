"""Structured output requests: what a body may ask for, checked and normalized (no torch).

Accepted, on both endpoints, at most one of:

- ``response_format`` in the OpenAI shape: ``{"type": "text"}`` (no constraint),
  ``{"type": "json_object"}`` (any JSON object), or ``{"type": "json_schema",
  "json_schema": {"name", "schema", "strict"?, "description"?}}``;
- ``guided_regex``: the output matches this regular expression (vLLM's extension);
- ``guided_choice``: the output is exactly one of these strings (vLLM's extension).

Normalized to one ``SamplingParams.structured`` dict: ``{"type": "json_schema", "schema"}``,
``{"type": "json_object"}``, ``{"type": "regex", "pattern"}`` or ``{"type": "choice",
"choices"}``. Whether a schema or pattern compiles is the grammar library's call
(``worker.engine.structured``): the API asks it at submission (``api/grammar_check.py``)
and answers 400 with its reason; a request that reaches a worker anyway fails alone.
"""

from __future__ import annotations

import json
from typing import Any

from worker.protocol.request_error import InvalidRequestError

FIELDS = frozenset({"response_format", "guided_regex", "guided_choice"})
MAX_SCHEMA_BYTES = 64 * 1024
MAX_PATTERN_CHARS = 4096
MAX_CHOICES = 256
MAX_CHOICE_CHARS = 1024
_JSON_SCHEMA_KEYS = frozenset({"name", "schema", "strict", "description"})


def structured_from_body(body: dict[str, Any]) -> dict[str, Any] | None:
    """The normalized constraint a request body asks for (None: free text); raises
    InvalidRequestError naming the field for anything malformed or combined."""
    asked = [name for name in sorted(FIELDS) if body.get(name) is not None]
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "text" and len(fmt) == 1:
        asked.remove("response_format")
    if len(asked) > 1:
        raise InvalidRequestError(f"give at most one of {', '.join(asked)}", param=asked[1])
    if not asked:
        return None
    name = asked[0]
    value = body[name]
    if name == "guided_regex":
        return {"type": "regex", "pattern": value}
    if name == "guided_choice":
        return {"type": "choice", "choices": value}
    return _response_format(value)


def _response_format(fmt: Any) -> dict[str, Any]:
    param = "response_format"
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise InvalidRequestError(
            'response_format must be {"type": "text"}, {"type": "json_object"} or '
            '{"type": "json_schema", "json_schema": {...}}', param=param)
    kind = fmt["type"]
    extra = set(fmt) - ({"type", "json_schema"} if kind == "json_schema" else {"type"})
    if extra:
        raise InvalidRequestError(f"response_format: unknown field {sorted(extra)[0]!r}", param=param)
    if kind == "json_object":
        return {"type": "json_object"}
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise InvalidRequestError(
            "response_format.json_schema must be an object with a `schema` object", param=param)
    unknown = set(spec) - _JSON_SCHEMA_KEYS
    if unknown:
        raise InvalidRequestError(
            f"response_format.json_schema: unknown field {sorted(unknown)[0]!r}", param=param)
    if "strict" in spec and not isinstance(spec["strict"], bool):
        raise InvalidRequestError("response_format.json_schema.strict must be true or false",
                                  param=param)
    return {"type": "json_schema", "schema": spec["schema"]}


def param_of(spec: dict[str, Any]) -> str:
    """The request field a normalized constraint came from (what an error names)."""
    return {"regex": "guided_regex", "choice": "guided_choice"}.get(
        str(spec.get("type")), "response_format")


def choice_pattern(choices: list[str]) -> str:
    """A regular expression matching exactly one of ``choices`` (each taken literally)."""
    special = set("\\.^$|?*+()[]{}")
    return "|".join("".join("\\" + ch if ch in special else ch for ch in c) for c in choices)


def check_structured(spec: dict[str, Any] | None, *, ignore_eos: bool) -> None:
    """Raise InvalidRequestError unless ``spec`` is a normalized constraint (or None) within
    bounds; a constraint ends its output with end-of-sequence, so ``ignore_eos`` conflicts."""
    if spec is None:
        return
    if not isinstance(spec, dict):
        raise InvalidRequestError("structured must be an object", param="response_format")
    kind = str(spec.get("type"))
    param = param_of(spec)
    if kind == "json_object" and set(spec) == {"type"}:
        pass
    elif kind == "json_schema" and isinstance(spec.get("schema"), dict):
        if len(json.dumps(spec["schema"])) > MAX_SCHEMA_BYTES:
            raise InvalidRequestError(
                f"the JSON schema is larger than {MAX_SCHEMA_BYTES} bytes", param=param)
    elif kind == "regex":
        pattern = spec.get("pattern")
        if not isinstance(pattern, str) or not 0 < len(pattern) <= MAX_PATTERN_CHARS:
            raise InvalidRequestError(
                f"guided_regex must be a non-empty string of at most {MAX_PATTERN_CHARS} "
                "characters", param=param)
    elif kind == "choice":
        choices = spec.get("choices")
        if not (isinstance(choices, list) and 0 < len(choices) <= MAX_CHOICES and all(
                isinstance(c, str) and 0 < len(c) <= MAX_CHOICE_CHARS for c in choices)):
            raise InvalidRequestError(
                f"guided_choice must be a list of 1 to {MAX_CHOICES} non-empty strings of at "
                f"most {MAX_CHOICE_CHARS} characters", param=param)
    else:
        raise InvalidRequestError(f"unknown structured output type {kind!r}", param=param)
    if ignore_eos:
        raise InvalidRequestError(
            "ignore_eos cannot be combined with structured output: the constraint ends the "
            "output with end-of-sequence", param="ignore_eos")
