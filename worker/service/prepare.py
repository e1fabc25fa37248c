"""Turn a job message into what the engine takes: prompt token ids and sampling params."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

from worker.protocol.openai_batch import parse_request_body, split_stored
from worker.protocol.sampling_params import InvalidRequestError, SamplingParams

log = logging.getLogger(__name__)


class Tokenizes(Protocol):
    """The part of the engine this module needs."""

    def tokenize(
        self, prompt: str | None = None, messages: list[dict] | None = None
    ) -> list[int]: ...


@dataclass
class Prepared:
    """A request ready for ``engine.add_request``."""

    prompt_token_ids: list[int]
    params: SamplingParams
    prompt: str | None


def prepare(*, engine: Tokenizes, stored: dict[str, Any]) -> Prepared:
    """Validate and tokenize; raises InvalidRequestError. A tokenizer or chat-template
    failure is reported by kind only: its own text (internals, paths) stays in the
    worker's debug log."""
    if not isinstance(stored, dict):
        raise InvalidRequestError("the job's request is not a JSON object")
    endpoint, body = split_stored(stored)
    req = parse_request_body(body, endpoint=endpoint)
    if isinstance(req.prompt, list):
        return Prepared(list(req.prompt), req.params, None)
    try:
        if req.messages is not None:
            return Prepared(engine.tokenize(messages=req.messages), req.params, None)
        return Prepared(engine.tokenize(prompt=req.prompt), req.params, req.prompt)
    except Exception as exc:
        cause = exc.__cause__ or exc
        log.debug("tokenizer refused a request: %s", type(cause).__name__)  # no prompt text
        raise InvalidRequestError(
            "the model's tokenizer or chat template could not process this request "
            f"({type(cause).__name__}); check the roles and content of the messages"
        ) from None
