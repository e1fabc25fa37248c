"""Sampling parameters of one request, validated on construction (no torch here)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from worker.protocol.limits import LIMITS
from worker.protocol.request_error import InvalidRequestError
from worker.protocol.structured_output import check_structured

__all__ = ["MAX_N", "InvalidRequestError", "SamplingParams"]

MAX_N = 16  # samples per request


@dataclass
class SamplingParams:
    """How to sample one request's output (vLLM-compatible names).

    temperature 0 means greedy. ``seed`` gives the request its own random stream, so
    the same seed gives the same text whatever else shares the batch.
    """

    n: int = 1
    max_tokens: int | None = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    # score the prompt: per prompt token (after the first) its logprob and rank, plus this
    # many top alternatives (vLLM's prompt_logprobs); None: not asked
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit
    # output constraint, normalized (worker.protocol.structured_output): json_schema,
    # json_object, regex or choice; None: free text
    structured: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if isinstance(self.stop, list | tuple):
            self.stop = list(self.stop)
        if isinstance(self.stop_token_ids, list | tuple):
            self.stop_token_ids = list(self.stop_token_ids)
        if self.stop is None:
            self.stop = []
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        if isinstance(self.logit_bias, dict):
            self.logit_bias = _int_keys(self.logit_bias)
        self.validate()

    def validate(self) -> None:
        """Raise InvalidRequestError naming the first bad field (ranges: ``LIMITS``)."""
        def bad(name: str, rule: str) -> InvalidRequestError:
            shown = repr(getattr(self, name))
            if len(shown) > 80:
                shown = shown[:77] + "..."
            return InvalidRequestError(f"{name}={shown}: {rule}", param=name)

        lim = LIMITS
        if not isinstance(self.n, int) or not 1 <= self.n <= MAX_N:
            raise bad("n", f"must be an integer in [1, {MAX_N}]")
        if self.max_tokens is not None and (
            not _is_int(self.max_tokens) or not 1 <= self.max_tokens <= lim.max_tokens_max
        ):
            raise bad("max_tokens", f"must be an integer in [1, {lim.max_tokens_max}]")
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= lim.max_tokens_max:
            raise bad("min_tokens", f"must be an integer in [0, {lim.max_tokens_max}]")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", "must not exceed max_tokens")
        if not _in_range(self.temperature, 0.0, lim.temperature_max):
            raise bad("temperature", f"must be a number in [0, {lim.temperature_max:g}]")
        if not _is_int(self.top_k) or not 0 <= self.top_k <= lim.top_k_max:
            raise bad("top_k", f"must be an integer in [0, {lim.top_k_max}] (0 disables it)")
        if not _in_range(self.top_p, 0.0, 1.0) or self.top_p == 0:
            raise bad("top_p", "must be in (0, 1]")
        if not _in_range(self.min_p, 0.0, 1.0):
            raise bad("min_p", "must be in [0, 1]")
        if not _in_range(
            self.repetition_penalty, lim.repetition_penalty_min, lim.repetition_penalty_max
        ):
            raise bad(
                "repetition_penalty",
                f"must be in [{lim.repetition_penalty_min:g}, {lim.repetition_penalty_max:g}]",
            )
        for name in ("presence_penalty", "frequency_penalty"):
            if not _in_range(getattr(self, name), -lim.penalty_abs_max, lim.penalty_abs_max):
                raise bad(name, f"must be in [-{lim.penalty_abs_max:g}, {lim.penalty_abs_max:g}]")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed <= lim.seed_max):
            raise bad("seed", f"must be an integer in [0, {lim.seed_max}]")
        self._validate_stops()
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or not 0 <= value <= 20):
                raise bad(name, "must be an integer in [0, 20]")
        for name in ("ignore_eos", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "must be true or false")
        self._validate_logit_bias()
        check_structured(self.structured, ignore_eos=self.ignore_eos)

    def _validate_stops(self) -> None:
        lim = LIMITS
        if not isinstance(self.stop, list) or len(self.stop) > lim.max_stop:
            raise InvalidRequestError(
                f"stop: at most {lim.max_stop} stop strings (got "
                f"{len(self.stop) if isinstance(self.stop, list) else type(self.stop).__name__})",
                param="stop",
            )
        if not all(isinstance(s, str) and 0 < len(s) <= lim.max_stop_chars for s in self.stop):
            raise InvalidRequestError(
                f"stop: stop strings must be non-empty strings of at most "
                f"{lim.max_stop_chars} characters",
                param="stop",
            )
        ids = self.stop_token_ids
        if not isinstance(ids, list) or len(ids) > lim.max_stop_token_ids:
            raise InvalidRequestError(
                f"stop_token_ids: at most {lim.max_stop_token_ids} token ids",
                param="stop_token_ids",
            )
        if not all(_is_int(t) and 0 <= t < (1 << 31) for t in ids):
            raise InvalidRequestError(
                "stop_token_ids: must be non-negative integer token ids", param="stop_token_ids"
            )

    def _validate_logit_bias(self) -> None:
        lim = LIMITS
        bias = self.logit_bias
        if bias is None:
            return
        if not isinstance(bias, dict) or len(bias) > lim.max_logit_bias:
            raise InvalidRequestError(
                f"logit_bias: an object of at most {lim.max_logit_bias} token ids",
                param="logit_bias",
            )
        for token, value in bias.items():
            if not _is_int(token) or not 0 <= token < (1 << 31):
                raise InvalidRequestError(
                    f"logit_bias: key {token!r} is not a token id (a non-negative integer)",
                    param="logit_bias",
                )
            if not _in_range(value, -lim.logit_bias_abs_max, lim.logit_bias_abs_max):
                raise InvalidRequestError(
                    f"logit_bias: the bias of token {token} must be a number in "
                    f"[-{lim.logit_bias_abs_max:g}, {lim.logit_bias_abs_max:g}], got {value!r}",
                    param="logit_bias",
                )

    @property
    def greedy(self) -> bool:
        """True when the output is the argmax at every step."""
        return self.temperature == 0.0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SamplingParams:
        """Build params from a dict, refusing unknown keys with a clear error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidRequestError(f"unknown sampling fields: {', '.join(unknown)}")
        return cls(**data)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _in_range(value: object, low: float, high: float) -> bool:
    """A finite number in [low, high] (NaN and infinities fail every comparison)."""
    return _is_number(value) and low <= value <= high  # type: ignore[operator]


def _int_keys(bias: dict[Any, Any]) -> dict[Any, Any]:
    """JSON object keys are strings: turn decimal-digit keys into token ids (others stay,
    for validate to refuse)."""
    out: dict[Any, Any] = {}
    for key, value in bias.items():
        if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 10:
            key = int(key)
        out[key] = value
    return out
