"""The submission check of structured output: a constraint the grammar library cannot
compile is a 400 at submission (and an error line of a batch), not a failed job later.

The compile runs in ``worker.engine.grammar_service`` (helper processes: the library
imports torch, which the API never does), the service the worker uses too. It is bounded
three ways, so that slow constraints never hold FastAPI's threads nor let anything in:

- a compile past ``INFLIGHT_GRAMMAR_TIMEOUT`` is killed and the request refused, 400
  ``grammar_too_complex`` (it would only stall a worker later);
- at most ``INFLIGHT_GRAMMAR_CONCURRENCY`` compile at once, each on its own helper, with
  no lock shared by unrelated requests; a request that finds them all busy waits
  ``INFLIGHT_GRAMMAR_WAIT`` at most (and only while few others wait), then gets 503
  ``grammar_check_busy`` with ``Retry-After`` (a batch expansion waits instead);
- answers are cached by (kind, canonical spec), so a batch whose lines share one schema
  compiles it once.

Only a helper that cannot start at all (the library not installed) lets the request in,
logged: the worker then fails the job alone with the reason.
"""

from __future__ import annotations

import logging
from typing import Any

from api.errors import ApiError
from worker.engine.grammar_service import BUSY, INVALID, TOO_COMPLEX, GrammarService

log = logging.getLogger(__name__)

EXPANSION_WAIT_S = 600.0  # a batch expansion waits this long for a free helper
RETRY_AFTER_S = 1


class GrammarChecker:
    """The API's side of the grammar service: verdicts as ApiErrors (thread-safe)."""

    def __init__(self, service: GrammarService | None = None) -> None:
        self.service = service or GrammarService()

    def check(self, spec: dict[str, Any] | None, *, patient: bool = False) -> None:
        """Raise the ApiError of ``spec`` (a normalized constraint; None: nothing to check):
        400 ``invalid_request`` with the library's reason, 400 ``grammar_too_complex``, or
        503 ``grammar_check_busy``. ``patient`` (batch expansion) waits for a helper."""
        if spec is None:
            return
        verdict = self.service.check(spec, wait_s=EXPANSION_WAIT_S if patient else None)
        if verdict.status == INVALID:
            raise ApiError(400, verdict.message, code="invalid_request", param=verdict.param)
        if verdict.status == TOO_COMPLEX:
            raise ApiError(400, verdict.message, code="grammar_too_complex", param=verdict.param)
        if verdict.status == BUSY:
            raise ApiError(503, verdict.message + "; retry shortly", code="grammar_check_busy",
                           headers={"Retry-After": str(RETRY_AFTER_S)})
        if not verdict.ok:
            log.warning("structured output not checked at submission (%s); the worker "
                        "will check it", verdict.message)

    def close(self) -> None:
        """Stop the helpers."""
        self.service.close()
