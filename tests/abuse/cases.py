"""The bad request bodies every entry must refuse, one table shared by the REST, batch
line, ``inflight enqueue`` and stream-message tests.

Each case is a completions (or chat) body with one field made bad, the ``param`` the
error must name and the ``code`` it must carry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BASE: dict[str, Any] = {"prompt": "hello there", "max_tokens": 4, "temperature": 0}
CHAT_BASE: dict[str, Any] = {
    "messages": [{"role": "user", "content": "hello"}],
    "max_tokens": 4,
    "temperature": 0,
}
MAX_PROMPT_TOKENS = 2_000  # the suite's API setting, so a long prompt stays small
MAX_TOKENS_LIMIT = 512


@dataclass(frozen=True)
class Case:
    """One bad body: ``patch`` is merged into the base body (chat when ``chat``)."""

    name: str
    patch: dict[str, Any]
    param: str | None
    code: str
    chat: bool = False
    api_only: bool = False  # depends on the API's own settings (max_tokens_limit...)

    def body(self) -> dict[str, Any]:
        """The full request body."""
        return {**(CHAT_BASE if self.chat else BASE), **self.patch}

    @property
    def endpoint(self) -> str:
        """The endpoint the body is for."""
        return "/v1/chat/completions" if self.chat else "/v1/completions"


def _deep(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


def _v(name: str, field: str, value: Any, code: str = "invalid_value") -> Case:
    return Case(name, {field: value}, field, code)


CASES: list[Case] = [
    # sampling numbers: out of range, huge, wrong type
    _v("temperature-negative", "temperature", -0.1),
    _v("temperature-huge", "temperature", 100.5),
    _v("temperature-1e308", "temperature", 1e308),
    _v("temperature-string", "temperature", "hot"),
    _v("top_p-zero", "top_p", 0),
    _v("top_p-above-1", "top_p", 1.5),
    _v("top_p-negative", "top_p", -1),
    _v("top_k-negative", "top_k", -1),
    _v("top_k-huge", "top_k", 1 << 21),
    _v("top_k-float", "top_k", 1.5, "invalid_request"),
    _v("min_p-negative", "min_p", -0.1),
    _v("min_p-above-1", "min_p", 1.1),
    _v("repetition_penalty-zero", "repetition_penalty", 0),
    _v("repetition_penalty-tiny", "repetition_penalty", 1e-30),
    _v("repetition_penalty-huge", "repetition_penalty", 101),
    _v("presence_penalty-high", "presence_penalty", 2.5),
    _v("presence_penalty-low", "presence_penalty", -3),
    _v("presence_penalty-1e300", "presence_penalty", 1e300),
    _v("frequency_penalty-high", "frequency_penalty", 2.01),
    _v("frequency_penalty-low", "frequency_penalty", -2.01),
    _v("seed-negative", "seed", -1),
    _v("seed-2**64", "seed", 1 << 64),
    _v("seed-float", "seed", 1.5, "invalid_request"),
    _v("max_tokens-zero", "max_tokens", 0),
    _v("max_tokens-negative", "max_tokens", -5),
    _v("max_tokens-2**21", "max_tokens", 1 << 21),
    _v("min_tokens-negative", "min_tokens", -1),
    Case("min_tokens-above-max", {"min_tokens": 5, "max_tokens": 4}, "min_tokens", "invalid_value"),
    _v("n-zero", "n", 0),
    _v("n-17", "n", 17),
    _v("logprobs-21", "logprobs", 21),
    _v("logprobs-negative", "logprobs", -1),
    _v("ignore_eos-string", "ignore_eos", "yes", "invalid_request"),
    # lists: count, element size, element type
    _v("stop-17-strings", "stop", [f"s{i}" for i in range(17)]),
    _v("stop-257-chars", "stop", ["x" * 257]),
    _v("stop-empty-string", "stop", [""]),
    _v("stop-number", "stop", [1], "invalid_request"),
    _v("stop-object", "stop", {"a": 1}, "invalid_request"),
    _v("stop_token_ids-65", "stop_token_ids", list(range(65))),
    _v("stop_token_ids-negative", "stop_token_ids", [-1]),
    _v("stop_token_ids-2**31", "stop_token_ids", [1 << 31]),
    _v("stop_token_ids-strings", "stop_token_ids", ["a"], "invalid_request"),
    _v("logit_bias-301", "logit_bias", {str(i): 1 for i in range(301)}),
    _v("logit_bias-above-100", "logit_bias", {"5": 101}),
    _v("logit_bias-below-100", "logit_bias", {"5": -101}),
    _v("logit_bias-1e300", "logit_bias", {"5": 1e300}),
    _v("logit_bias-bad-key", "logit_bias", {"x": 1}),
    _v("logit_bias-string-value", "logit_bias", {"5": "a"}),
    _v("logit_bias-list", "logit_bias", [1, 2], "invalid_request"),
    # metadata and user: validated, never dropped
    _v("metadata-17-keys", "metadata", {f"k{i}": "v" for i in range(17)}),
    _v("metadata-long-key", "metadata", {"k" * 65: "v"}),
    _v("metadata-long-value", "metadata", {"k": "v" * 513}),
    _v("metadata-number-value", "metadata", {"k": 1}),
    _v("metadata-string", "metadata", "tags"),
    _v("metadata-empty-key", "metadata", {"": "v"}),
    _v("user-257-chars", "user", "u" * 257),
    _v("user-number", "user", 5),
    _v("model-257-chars", "model", "m" * 257),
    _v("model-number", "model", 5),
    # encodings, NUL, depth
    _v("prompt-lone-surrogate", "prompt", "abc\ud800def", "invalid_encoding"),
    _v("prompt-nul", "prompt", "abc\x00def"),
    _v("stop-nul", "stop", ["a\x00"]),
    _v("stop-lone-surrogate", "stop", ["\udfff"], "invalid_encoding"),
    _v("metadata-surrogate-key", "metadata", {"\ud83d": "v"}, "invalid_encoding"),
    _v("user-deep-json", "user", _deep(40), "too_deep"),
    _v("metadata-deep-json", "metadata", {"a": _deep(40)}, "too_deep"),
    _v("prompt-deep-json", "prompt", _deep(33), "too_deep"),
    # prompts
    _v("prompt-empty", "prompt", "", "invalid_request"),
    _v("prompt-empty-list", "prompt", [], "invalid_request"),
    _v("prompt-negative-token", "prompt", [-1], "invalid_request"),
    _v("prompt-token-2**31", "prompt", [1 << 31], "invalid_request"),
    _v("prompt-list-of-prompts", "prompt", ["a", "b"], "unsupported"),
    _v("prompt-object", "prompt", {"text": "x"}, "invalid_request"),
    # fields and modes
    _v("unknown-field", "frobnicate", [], "unknown_field"),
    _v("tool-calling", "tools", [], "unsupported_field"),
    _v("stream-true", "stream", True, "unsupported"),
    # chat messages
    Case("messages-1025", {"messages": [{"role": "user", "content": "x"}] * 1025},
         "messages", "invalid_request", chat=True),
    Case("messages-bad-role", {"messages": [{"role": "root", "content": "x"}]},
         "messages", "invalid_request", chat=True),
    Case("messages-long-name", {"messages": [{"role": "user", "content": "x", "name": "n" * 257}]},
         "messages", "invalid_request", chat=True),
    Case("messages-content-number", {"messages": [{"role": "user", "content": 5}]},
         "messages", "invalid_request", chat=True),
    Case("messages-image-part", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         "messages", "unsupported", chat=True),
    Case("messages-surrogate", {"messages": [{"role": "user", "content": "\udc00"}]},
         "messages", "invalid_encoding", chat=True),
    Case("messages-empty", {"messages": []}, "messages", "invalid_request", chat=True),
    # limits that are the API's settings (the worker has the model's own)
    Case("prompt-over-bound", {"prompt": "x" * MAX_PROMPT_TOKENS}, "prompt", "prompt_too_long",
         api_only=True),
    Case("prompt-multibyte-over-bound", {"prompt": "é" * (MAX_PROMPT_TOKENS // 2)}, "prompt",
         "prompt_too_long", api_only=True),
    Case("max_tokens-over-limit", {"max_tokens": MAX_TOKENS_LIMIT + 1}, "max_tokens",
         "invalid_value", api_only=True),
]
