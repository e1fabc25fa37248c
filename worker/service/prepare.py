"""Turn a job message into what the engine takes: prompt token ids and sampling params."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from worker.protocol.openai_batch import parse_request_body, split_stored
from worker.protocol.sampling_params import SamplingParams


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
    """Validate and tokenize; raises InvalidRequestError (or the tokenizer's error)."""
    endpoint, body = split_stored(stored)
    req = parse_request_body(body, endpoint=endpoint)
    if req.messages is not None:
        return Prepared(engine.tokenize(messages=req.messages), req.params, None)
    if isinstance(req.prompt, list):
        return Prepared(list(req.prompt), req.params, None)
    return Prepared(engine.tokenize(prompt=req.prompt), req.params, req.prompt)
