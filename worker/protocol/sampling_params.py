"""Sampling parameters of one request, validated on construction (no torch here)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

MAX_N = 16  # samples per request
# The job store keeps one sample per job, so the queued paths (API, batches, enqueue)
# refuse n > 1; `inflight generate` and the in-process engine serve it.
QUEUED_N_UNSUPPORTED = (
    "n > 1 is not supported by the queued service yet; "
    "use inline generation with `inflight generate` for n > 1"
)


class InvalidRequestError(ValueError):
    """A request that can never be served as asked: bad values, too long, too large."""


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
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.validate()

    def validate(self) -> None:
        """Raise InvalidRequestError naming the first bad field."""
        def bad(name: str, rule: str) -> InvalidRequestError:
            return InvalidRequestError(f"{name}={getattr(self, name)!r}: {rule}")

        if not isinstance(self.n, int) or not 1 <= self.n <= MAX_N:
            raise bad("n", f"must be an integer in [1, {MAX_N}]")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise bad("max_tokens", "must be an integer >= 1")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise bad("min_tokens", "must be an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", "must not exceed max_tokens")
        if not _is_number(self.temperature) or self.temperature < 0:
            raise bad("temperature", "must be a number >= 0")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise bad("top_k", "must be an integer >= 0 (0 disables it)")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise bad("top_p", "must be in (0, 1]")
        if not _is_number(self.min_p) or not 0 <= self.min_p <= 1:
            raise bad("min_p", "must be in [0, 1]")
        if not _is_number(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise bad("repetition_penalty", "must be > 0")
        for name in ("presence_penalty", "frequency_penalty"):
            if not _is_number(getattr(self, name)) or not -2 <= getattr(self, name) <= 2:
                raise bad(name, "must be in [-2, 2]")
        if self.seed is not None and not isinstance(self.seed, int):
            raise bad("seed", "must be an integer")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise bad("stop", "must be non-empty strings")
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "must be non-negative integers")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= 20):
            raise bad("logprobs", "must be an integer in [0, 20]")

    @property
    def greedy(self) -> bool:
        """True when the output is the argmax at every step."""
        return self.temperature == 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict that `from_dict` turns back into the same params."""
        return asdict(self)

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
