"""What the engine loop needs of an engine (``worker.engine.LLMEngine`` or a test double),
and how an engine error is worded on the job it fails."""

from __future__ import annotations

from typing import Any, Protocol

from worker.engine.outputs import RequestOutput, StepStats
from worker.protocol.sampling_params import InvalidRequestError, SamplingParams


class EngineAPI(Protocol):
    """The engine as the loop drives it (``tokenizer``: a Hugging Face tokenizer, or None
    for an engine that does not decode token ids itself)."""

    tokenizer: Any

    def tokenize(
        self, prompt: str | None = None, messages: list[dict] | None = None
    ) -> list[int]: ...
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams | None = None,
        *,
        prompt: str | None = None,
        priority: int = 0,
        tenant: str | None = None,
        arrival_time: float | None = None,
        service_class: str = "interactive",
    ) -> None: ...
    def abort_request(self, request_id: str) -> None: ...
    def step(self) -> tuple[list[RequestOutput], StepStats]: ...
    def has_unfinished_requests(self) -> bool: ...
    def admission_capacity(self) -> int: ...
    def interactive_capacity(self) -> int: ...


def error_text(exc: BaseException) -> str:
    """The error as a job shows it: a request error's own words, else its type and text."""
    if isinstance(exc, InvalidRequestError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
