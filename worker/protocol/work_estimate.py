"""A job's work as the scheduler estimates it from its stored request, before any tokenizer
sees it (standard library only): its prompt tokens, about one per four characters of
text (a token-id prompt counts its ids), plus the output tokens it allows (``max_tokens``
or ``max_completion_tokens`` times ``n``; without one, 16 for ``/v1/completions``, which is
OpenAI's default, and :data:`CHAT_OUTPUT_GUESS` for a chat request, which may run to the
model's context).

The unit is a token the engine computes, prompt or output: the same unit as the rate the
workers measure (``worker.queue.lanes``: estimated work finished per engine-second), so an
estimate that is too high for a whole workload (outputs that stop early) is divided by a
rate that is as much too high, and the time it predicts holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CHARS_PER_TOKEN = 4
COMPLETIONS_OUTPUT_DEFAULT = 16
CHAT_OUTPUT_GUESS = 256


def work_estimate(stored: Mapping[str, Any]) -> int:
    """Estimated tokens of one stored request (``{"url", "body"}``); at least 1. A body
    the estimate cannot read counts as its default output alone (the worker refuses it)."""
    body = stored.get("body")
    body = body if isinstance(body, Mapping) else {}
    chat = "messages" in body or str(stored.get("url", "")).endswith("/chat/completions")
    return max(1, _prompt_tokens(body) + _output_tokens(body, chat=chat))


def _prompt_tokens(body: Mapping[str, Any]) -> int:
    if "messages" in body:
        return _text_tokens(body["messages"])
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt)  # token ids
    return _text_tokens(prompt)


def _text_tokens(value: Any) -> int:
    """Tokens of every string inside ``value`` (messages, content parts, prompt lists)."""
    chars, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            chars += len(item)
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return -(-chars // CHARS_PER_TOKEN)


def _output_tokens(body: Mapping[str, Any], *, chat: bool) -> int:
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        limit = CHAT_OUTPUT_GUESS if chat else COMPLETIONS_OUTPUT_DEFAULT
    n = body.get("n", 1)
    n = n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1
    return limit * n
