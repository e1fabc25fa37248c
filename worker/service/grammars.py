"""The worker's grammar compiles: each structured-output job's grammar is compiled on the
intake thread, before the job reaches the inbox, never on the engine thread and never under
the loop's lock (a long compile there stalled every step, and the cancel poll of the
keep-alive thread that waits on that lock).

First ``worker.engine.grammar_service`` compiles the constraint in its helper process
against the engine's own vocabulary, bounded by ``WorkerConfig.grammar_timeout`` (killed
past it); a job whose grammar is refused or too slow gets ``grammar_error`` and is failed
alone by the engine loop, the next job goes on. Only then is the grammar compiled in this
process (``Grammars.compiled``: the helper proved it ends in about the bound) and handed to
``engine.add_request`` precompiled, so the engine thread compiles nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from typing import Any

from worker.engine.grammar_service import PROBE, UNAVAILABLE, GrammarService
from worker.protocol.openai_batch import parse_request_body, split_stored
from worker.service.engine_api import error_text
from worker.service.held_jobs import HeldJob

log = logging.getLogger(__name__)

PATIENCE_S = 600.0  # how long a job waits for a free helper (the intake's jobs queue here)


class WorkerGrammars:
    """Bounded compiles for one worker's engine (``grammars``: its ``Grammars``, or None
    for an engine without structured output: then nothing is done here). The helper and
    its vocabulary file are made at the first structured-output job, so a worker that
    never sees one never loads xgrammar."""

    def __init__(self, grammars: Any | None, *, timeout_s: float, max_concurrent: int = 1,
                 command: list[str] | None = None) -> None:
        self.grammars, self.timeout_s, self.max_concurrent = grammars, timeout_s, max_concurrent
        self.command = command or PROBE
        self.service: GrammarService | None = None
        self._info_path: str | None = None

    @classmethod
    def for_engine(cls, engine: Any, *, timeout_s: float, max_concurrent: int = 1,
                   command: list[str] | None = None) -> WorkerGrammars:
        """The compiles of ``engine`` (an ``LLMEngine``; a test double without ``grammars``
        gets a no-op). ``command``: the helper, before ``--tokenizer-info FILE``."""
        grammars = getattr(engine, "grammars", None)
        if grammars is None or not hasattr(grammars, "tokenizer_info_json"):
            grammars = None
        return cls(grammars, timeout_s=timeout_s, max_concurrent=max_concurrent, command=command)

    def _service(self) -> GrammarService:
        if self.service is None:
            assert self.grammars is not None
            fd, path = tempfile.mkstemp(prefix="inflight-vocab-", suffix=".json")
            self._info_path = path
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(self.grammars.tokenizer_info_json())
            self.service = GrammarService(
                timeout_s=self.timeout_s, max_concurrent=self.max_concurrent,
                command=[*self.command, "--tokenizer-info", path],
            )
        return self.service

    def prepare(self, held: list[HeldJob]) -> None:
        """Compile the grammar of each structured-output job of ``held`` (see the module
        docstring); set ``grammar`` or ``grammar_error`` on it."""
        if self.grammars is None:
            return
        for h in held:
            spec = _structured(h)
            if spec is None:
                continue
            verdict = self._service().check(spec, wait_s=PATIENCE_S)
            if verdict.status == UNAVAILABLE:
                h.grammar_error = f"structured output could not be checked: {verdict.message}"
            elif not verdict.ok:
                h.grammar_error = verdict.message
            else:
                try:
                    h.grammar = self.grammars.compiled(spec)
                except Exception as exc:
                    h.grammar_error = error_text(exc)

    def close(self) -> None:
        """Stop the helper and remove the vocabulary file."""
        if self.service is not None:
            self.service.close()
        if self._info_path:
            with contextlib.suppress(OSError):
                os.unlink(self._info_path)


def _structured(held: HeldJob) -> dict[str, Any] | None:
    """The job's normalized constraint; None when it has none or its body does not parse
    (the engine loop then fails it with the parser's words)."""
    msg = held.delivery.message
    if msg is None or not isinstance(msg.body, dict):
        return None
    try:
        endpoint, body = split_stored(msg.body)
        return parse_request_body(body, endpoint=endpoint).params.structured
    except Exception:
        return None
