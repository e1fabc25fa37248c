"""The engine as the loop drives it: what the loop needs of one (``worker.engine.LLMEngine``
or a test double), how an engine error is worded on the job it fails, and how the loop
tells a job that fails alone from an engine that fails whatever it runs.

After a failed step the loop runs a known-good probe (a one-token greedy request, alone in
the engine). If the probe fails too, the engine is broken (a CUDA error, out of memory, a
corrupt state): the worker hands every held job back unfailed and exits non-zero, so that
its supervisor restarts it and no job is failed for the worker's fault."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from worker.engine.outputs import RequestOutput, StepStats
from worker.protocol.sampling_params import InvalidRequestError, SamplingParams

log = logging.getLogger(__name__)


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
    def step(self, between_layers: Callable[[], None] | None = None) -> tuple[list[RequestOutput], StepStats]: ...
    def interjected_step(self) -> tuple[list[RequestOutput], StepStats] | None: ...
    def has_unfinished_requests(self) -> bool: ...
    def admission_capacity(self) -> int: ...
    def interactive_capacity(self) -> int: ...


def error_text(exc: BaseException) -> str:
    """The error as a job shows it: a request error's own words, else its type and text."""
    if isinstance(exc, InvalidRequestError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


class EngineBroken(RuntimeError):
    """The engine fails even a known-good request: stop taking work, hand jobs back, exit."""


def probe_engine(engine: EngineAPI, *, max_steps: int = 8) -> bool:
    """Run a one-token greedy request alone; whether the engine completes it (call it with
    no other request in the engine)."""
    request_id = f"__probe_{uuid.uuid4().hex[:8]}"
    try:
        ids = engine.tokenize(prompt="ping")
        engine.add_request(request_id, ids, SamplingParams(max_tokens=1, temperature=0.0))
        for _ in range(max_steps):
            outputs, _stats = engine.step()
            if any(o.request_id == request_id and o.finished for o in outputs):
                return True
    except Exception as exc:
        log.error("engine probe failed: %s: %s", type(exc).__name__, exc)
    with contextlib.suppress(Exception):
        engine.abort_request(request_id)
    return False
