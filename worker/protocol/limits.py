"""The limits every input is held to, in one table (standard library only).

Every entry point (REST bodies, batch lines, ``inflight enqueue``, stream messages read
by the worker, ``LLM.generate``) goes through :class:`SamplingParams` and the request
parser, which read :data:`LIMITS`; docs/configuration.md documents the same table. A value outside
these bounds is refused with a clear error naming the field, never clamped or dropped.

The numeric ranges keep the sampler finite: logits of a real model are at most a few
thousand in magnitude, so dividing them by ``repetition_penalty_min`` or adding
``logit_bias_max`` cannot overflow float32.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class InputLimits:
    """Bounds on request fields (counts, characters, ranges); see docs/configuration.md."""

    temperature_max: float = 100.0
    top_k_max: int = 1 << 20
    repetition_penalty_min: float = 0.01
    repetition_penalty_max: float = 100.0
    penalty_abs_max: float = 2.0  # presence_penalty, frequency_penalty
    logit_bias_abs_max: float = 100.0
    max_logit_bias: int = 300  # entries
    seed_max: int = (1 << 64) - 1  # seeds are in [0, seed_max]
    max_tokens_max: int = 1 << 20  # the API applies its own, lower, setting too
    max_stop: int = 16  # stop strings
    max_stop_chars: int = 256  # characters per stop string
    max_stop_token_ids: int = 64
    max_messages: int = 1024
    max_content_parts: int = 1024  # text parts of one message's content
    max_prompt_token_ids: int = 1 << 20
    max_metadata_keys: int = 16
    max_metadata_key_chars: int = 64
    max_metadata_value_chars: int = 512
    max_user_chars: int = 256
    max_name_chars: int = 256  # model, messages[].name
    max_id_chars: int = 512  # custom_id and other caller-chosen ids
    max_json_depth: int = 32  # nesting of arrays and objects in one request
    max_tenant_chars: int = 128


LIMITS = InputLimits()
"""The limits in force (immutable)."""

TENANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
"""Tenant names: 1-128 characters, ASCII letters, digits, ``.``, ``_``, ``-``; the first
a letter or digit."""

_TENANT_RE = re.compile(TENANT_PATTERN)
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


class LimitError(ValueError):
    """A value outside the limits; ``param`` names the field, ``code`` the kind."""

    def __init__(self, message: str, *, param: str | None, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def check_tenant(tenant: object) -> str:
    """Return ``tenant`` when it is a valid tenant name, else raise LimitError."""
    if not isinstance(tenant, str) or not _TENANT_RE.match(tenant):
        raise LimitError(
            f"tenant {tenant!r} is not a valid tenant name: 1-128 characters of A-Z a-z 0-9 "
            "'.' '_' '-', starting with a letter or digit",
            param="tenant",
        )
    return tenant


def check_id(value: object, *, param: str) -> str:
    """Return a caller-chosen id (custom_id...): a non-empty string of at most
    ``max_id_chars`` characters without control characters; else raise LimitError."""
    if not isinstance(value, str) or not value:
        raise LimitError(f"{param} must be a non-empty string, got {value!r}", param=param)
    if len(value) > LIMITS.max_id_chars:
        raise LimitError(
            f"{param} has {len(value)} characters; the limit is {LIMITS.max_id_chars}",
            param=param,
        )
    if _CONTROL_RE.search(value):
        raise LimitError(f"{param} must not contain control characters", param=param)
    check_text(value, param=param)
    return value


def check_text(value: str, *, param: str) -> None:
    """Refuse a string that UTF-8 cannot encode (a lone surrogate) or that holds NUL,
    which PostgreSQL cannot store."""
    if "\x00" in value:
        raise LimitError(f"{param} must not contain the NUL character (\\u0000)", param=param)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise LimitError(
            f"{param} is not valid Unicode: a lone surrogate at character {exc.start}",
            param=param,
            code="invalid_encoding",
        ) from None


def check_json_value(value: Any, *, param: str) -> None:
    """The check every stored JSON value passes (request bodies, batch lines, ``inflight
    enqueue`` lines, metadata): walk a parsed JSON value and refuse, naming ``param``, what
    the store cannot keep or give back as JSON: a number that is not finite (``1e400``
    parses to infinity, some parsers accept ``NaN``; PostgreSQL refuses both), a string or
    object key that UTF-8 cannot encode or that holds NUL (see :func:`check_text`), and
    nesting deeper than ``max_json_depth``. Iterative, so a deep value cannot exhaust the
    stack."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            check_text(item, param=param)
            continue
        if isinstance(item, float):
            check_finite(item, param=param)
            continue
        if not isinstance(item, dict | list):
            continue
        if depth > LIMITS.max_json_depth:
            raise LimitError(
                f"{param} is nested deeper than {LIMITS.max_json_depth} levels",
                param=param,
                code="too_deep",
            )
        if isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str):
                    check_text(key, param=param)
                stack.append((child, depth + 1))
        else:
            stack.extend((child, depth + 1) for child in item)


def check_finite(value: float, *, param: str) -> None:
    """Refuse a number JSON cannot carry: infinite (``1e400`` overflows a double) or NaN."""
    if not math.isfinite(value):
        raise LimitError(
            f"{param} holds the number {value!r}: numbers must be finite (a literal such as "
            "1e400 overflows to infinity)",
            param=param,
        )


def check_metadata(value: object, *, param: str = "metadata") -> dict[str, str] | None:
    """Validate OpenAI-style metadata (a job's): at most 16 string keys of at most 64
    characters, string values of at most 512, and what every stored JSON value passes
    (:func:`check_json_value`); returns it (None stays None)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise LimitError(f"{param} must be an object of strings", param=param)
    if len(value) > LIMITS.max_metadata_keys:
        raise LimitError(
            f"{param} has {len(value)} keys; the limit is {LIMITS.max_metadata_keys}",
            param=param,
        )
    for key, item in value.items():
        if not isinstance(key, str) or not key or len(key) > LIMITS.max_metadata_key_chars:
            raise LimitError(
                f"{param} keys must be strings of 1-{LIMITS.max_metadata_key_chars} characters",
                param=param,
            )
        if not isinstance(item, str) or len(item) > LIMITS.max_metadata_value_chars:
            raise LimitError(
                f"{param}[{key!r}] must be a string of at most "
                f"{LIMITS.max_metadata_value_chars} characters",
                param=param,
            )
    check_json_value(value, param=param)
    return dict(value)


def check_short_string(value: object, *, param: str, limit: int) -> str | None:
    """A string field of at most ``limit`` characters (None stays None)."""
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise LimitError(f"{param} must be a string of at most {limit} characters", param=param)
    check_text(value, param=param)
    return value


def prompt_token_upper_bound(*, text_bytes: int, num_messages: int) -> int:
    """An upper bound of the tokens a prompt can take, without the tokenizer: byte-level
    BPE and byte-fallback tokenizers spend at most one token per UTF-8 byte (plus a
    leading space marker), and a chat template adds at most ``CHAT_OVERHEAD_PER_MESSAGE``
    per message and ``CHAT_OVERHEAD_FIXED`` for the generation prompt."""
    if num_messages:
        return text_bytes + num_messages * CHAT_OVERHEAD_PER_MESSAGE + CHAT_OVERHEAD_FIXED
    return text_bytes + 1


CHAT_OVERHEAD_PER_MESSAGE = 16
CHAT_OVERHEAD_FIXED = 64
