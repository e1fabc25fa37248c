"""Validation of a request's prompt and chat messages (standard library only)."""

from __future__ import annotations

from typing import Any

from worker.protocol.limits import LIMITS
from worker.protocol.openai_errors import RequestParseError

ROLES = ("system", "user", "assistant", "developer")


def parse_prompt(prompt: object) -> str | list[int]:
    """Validate a completion prompt: one non-empty string or one list of token ids."""
    if prompt is None:
        raise RequestParseError("prompt is required", param="prompt", code="missing_field")
    if isinstance(prompt, str):
        if not prompt:
            raise RequestParseError("prompt must not be empty", param="prompt")
        return prompt
    if isinstance(prompt, list) and len(prompt) > LIMITS.max_prompt_token_ids:
        raise RequestParseError(
            f"prompt has {len(prompt)} token ids; the limit is {LIMITS.max_prompt_token_ids}",
            param="prompt", code="prompt_too_long")
    if isinstance(prompt, list) and prompt and all(is_int(t) for t in prompt):
        if any(t < 0 or t >= 1 << 31 for t in prompt):
            raise RequestParseError("prompt token ids must be in [0, 2**31)", param="prompt")
        return list(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        raise RequestParseError(
            "prompt must be one string or one list of token ids; send one request per "
            "prompt", param="prompt", code="unsupported")
    raise RequestParseError(
        f"prompt must be a non-empty string or a non-empty list of token ids, got "
        f"{json_type(prompt)}", param="prompt")


def parse_messages(messages: object) -> list[dict[str, Any]]:
    """Validate chat messages; returns copies with text parts joined into one string and
    the ``developer`` role mapped to ``system`` (what chat templates know)."""
    if messages is None:
        raise RequestParseError("messages is required", param="messages", code="missing_field")
    if not isinstance(messages, list) or not messages:
        raise RequestParseError("messages must be a non-empty list of {role, content} objects",
                                param="messages")
    if len(messages) > LIMITS.max_messages:
        raise RequestParseError(
            f"messages has {len(messages)} entries; the limit is {LIMITS.max_messages}",
            param="messages")
    return [_parse_message(i, m) for i, m in enumerate(messages)]


def _parse_message(i: int, message: object) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise RequestParseError(f"{where} must be an object with role and content",
                                param="messages")
    unknown = sorted(message.keys() - {"role", "content", "name"})
    if unknown:
        raise RequestParseError(
            f"{where} has unsupported field {unknown[0]!r}; messages take role, content "
            "and name", param="messages", code="unsupported")
    role = message.get("role")
    if role not in ROLES:
        raise RequestParseError(f"{where}.role must be one of {', '.join(ROLES)}, got "
                                f"{role!r}", param="messages")
    name = message.get("name")
    if name is not None and (not isinstance(name, str) or len(name) > LIMITS.max_name_chars):
        raise RequestParseError(
            f"{where}.name must be a string of at most {LIMITS.max_name_chars} characters",
            param="messages")
    out: dict[str, Any] = {"role": "system" if role == "developer" else role,
                           "content": _message_text(where, message.get("content"))}
    if name is not None:
        out["name"] = name
    return out


def _message_text(where: str, content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and len(content) > LIMITS.max_content_parts:
        raise RequestParseError(
            f"{where}.content has {len(content)} parts; the limit is "
            f"{LIMITS.max_content_parts}", param="messages")
    if isinstance(content, list) and content:
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = (f"of type {part.get('type')!r}" if isinstance(part, dict)
                        else json_type(part))
                raise RequestParseError(
                    f"{where}.content[{j}] is {kind}; only text parts "
                    "({\"type\": \"text\", \"text\": ...}) are supported", param="messages",
                    code="unsupported")
            if not isinstance(part.get("text"), str) or part.keys() - {"type", "text"}:
                raise RequestParseError(
                    f"{where}.content[{j}] must be {{\"type\": \"text\", \"text\": <string>}}",
                    param="messages")
            texts.append(part["text"])
        return join_text_parts(texts)
    raise RequestParseError(
        f"{where}.content must be a string or a non-empty list of text parts, got "
        f"{json_type(content)}", param="messages")


def join_text_parts(texts: list[str]) -> str:
    """The prompt text of a message given as text parts: the parts joined by newlines.
    The one definition: the prompt the worker templates and the API's token estimate
    (``api.limits``) both take it from here, so an estimate cannot miss a separator."""
    return "\n".join(texts)


def is_int(value: object) -> bool:
    """True for a JSON integer (a Python int that is not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def json_type(value: object) -> str:
    """How to name ``value``'s JSON type in an error message ("a string", "null"...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array" if value else "an empty array"
    return "an object"
