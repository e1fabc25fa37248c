"""The engine loop of ``inflight generate``: feed requests, step, write each finished one.

Works with any engine exposing ``tokenize``, ``add_request``, ``step``,
``has_unfinished_requests``, ``num_unfinished_requests``, ``model_name`` and ``tokenizer``
(``worker.engine.LLMEngine``); it imports no torch itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from cli.jsonl_io import ResultsFile
from worker.protocol.openai_batch import (
    GenerationRequest,
    RequestParseError,
    build_response_body,
    format_batch_output_line,
    format_error_line,
    new_request_id,
    samples_of,
)
from worker.protocol.sampling_params import InvalidRequestError


@dataclass
class WorkItem:
    """One input line still to answer: a parsed request, or the error that refused it."""

    line_number: int
    custom_id: str  # the output line's custom_id: the line's own, or ``line-<n>``
    request: GenerationRequest | None = None
    error: RequestParseError | None = None
    own_id: bool = True  # False when custom_id was made up as ``line-<n>``


class Progress:
    """Counts done/failed lines and generated tokens; drives an optional tqdm bar."""

    def __init__(self, total: int | None, *, enabled: bool) -> None:
        self.done = self.failed = self.tokens = 0
        self.start = time.perf_counter()
        self._last_postfix = 0.0
        self._bar: Any = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit="req", desc="generate", dynamic_ncols=True)

    def restart_clock(self) -> None:
        """Start the tokens/s clock now (after the model has loaded)."""
        self.start = time.perf_counter()

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of wall time since the start."""
        return self.tokens / max(time.perf_counter() - self.start, 1e-9)

    def line_written(self, *, failed: bool) -> None:
        """Count one finished line (success or error)."""
        self.done += 1
        self.failed += failed
        if self._bar is not None:
            self._bar.update(1)
        self._postfix(force=failed)

    def line_skipped(self) -> None:
        """Count one line already answered by an earlier run (it moves the bar only)."""
        if self._bar is not None:
            self._bar.update(1)

    def tokens_generated(self, count: int) -> None:
        """Count tokens generated in a step."""
        self.tokens += count
        self._postfix()

    def close(self) -> None:
        """Final refresh of the bar."""
        if self._bar is not None:
            self._postfix(force=True)
            self._bar.close()

    def _postfix(self, force: bool = False) -> None:
        now = time.perf_counter()
        if self._bar is None or (not force and now - self._last_postfix < 0.5):
            return
        self._last_postfix = now
        self._bar.set_postfix_str(f"tok/s={self.tokens_per_second:.1f} failed={self.failed}")


def run_requests(engine_source: Callable[[], Any], items: Iterable[WorkItem],
                 writer: ResultsFile, progress: Progress, *, window: int) -> None:
    """Generate every item, writing each output line as soon as it finishes.

    Items are pulled from ``items`` only while fewer than ``window`` requests sit in the
    engine, so a file of any length is read as it is worked (memory stays flat). An item
    refused at parse time gets its error line when it is reached; a request the engine
    refuses (too long, bigger than the KV pool) gets one too. ``engine_source`` is called
    at the first request that needs the engine (and may load it then).
    """
    pending = iter(items)
    running: dict[str, WorkItem] = {}
    engine: Any = None
    exhausted = False
    while True:
        while not exhausted and (engine is None or engine.num_unfinished_requests() < window):
            item = next(pending, None)
            if item is None:
                exhausted = True
            elif item.error is not None:
                _write_error(writer, progress, item, new_request_id(), item.error)
            else:
                engine = engine if engine is not None else engine_source()
                _feed(engine, writer, progress, item, running)
        if engine is None or not (running or engine.has_unfinished_requests()):
            return
        _step(engine, writer, progress, running)


def _feed(engine: Any, writer: ResultsFile, progress: Progress, item: WorkItem,
          running: dict[str, WorkItem]) -> None:
    request_id = new_request_id()
    try:
        _add(engine, request_id, item)
    except InvalidRequestError as exc:
        _write_error(writer, progress, item, request_id, exc)
        return
    running[request_id] = item


def _step(engine: Any, writer: ResultsFile, progress: Progress,
          running: dict[str, WorkItem]) -> None:
    if not engine.has_unfinished_requests():
        for request_id, item in running.items():  # lost by the engine: never silently
            _write_error(writer, progress, item, request_id,
                         InvalidRequestError("the engine dropped the request"),
                         status_code=500, code="engine_error")
        running.clear()
        return
    outputs, _ = engine.step()
    progress.tokens_generated(sum(len(out.new_token_ids) for out in outputs))
    for out in outputs:
        if out.finished and out.request_id in running:
            _write_result(engine, writer, progress, running.pop(out.request_id), out)


def _add(engine: Any, request_id: str, item: WorkItem) -> None:
    request = item.request
    assert request is not None
    if request.messages is not None:
        ids = engine.tokenize(messages=request.messages)
    elif isinstance(request.prompt, str):
        ids = engine.tokenize(prompt=request.prompt)
    else:
        ids = list(request.prompt or [])
    prompt = request.prompt if isinstance(request.prompt, str) else None
    engine.add_request(request_id, ids, request.params, prompt=prompt)


def _write_result(engine: Any, writer: ResultsFile, progress: Progress, item: WorkItem,
                  out: Any) -> None:
    request = item.request
    assert request is not None
    if out.error is not None or out.finish_reason == "abort":
        message = out.error or "the request was aborted"
        _write_error(writer, progress, item, out.request_id,
                     InvalidRequestError(message), status_code=500, code="engine_error")
        return
    samples = samples_of(out, getattr(engine, "tokenizer", None))
    body = build_response_body(
        is_chat=request.is_chat, request_id=out.request_id, model=engine.model_name,
        choices=samples, prompt_tokens=len(out.prompt_token_ids),
        completion_tokens=sum(len(c.token_ids or ()) for c in samples),
        created=int(time.time()), with_logprobs=request.params.logprobs is not None,
    )
    writer.write(format_batch_output_line(custom_id=item.custom_id, request_id=out.request_id,
                                          response_body=body, status_code=200, error=None))
    progress.line_written(failed=False)


def _write_error(writer: ResultsFile, progress: Progress, item: WorkItem, request_id: str,
                 exc: InvalidRequestError, *, status_code: int = 400,
                 code: str | None = None) -> None:
    if isinstance(exc, RequestParseError):
        message, param, code = str(exc), exc.param, code or exc.code
    else:
        message = str(RequestParseError(str(exc), line_number=item.line_number,
                                        custom_id=item.custom_id if item.own_id else None))
        param, code = None, code or "invalid_request"
    writer.write(format_error_line(custom_id=item.custom_id, request_id=request_id,
                                   message=message, code=code, param=param,
                                   status_code=status_code))
    progress.line_written(failed=True)
