"""Plain data carried into and out of the repository functions (no ORM state)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass
class NewJob:
    """A job to insert. ``id`` is filled by ``new_job_id()`` when left empty. ``model``: the
    model id it runs on; None takes the model of the queue keys it is enqueued with
    (``worker.jobs.enqueue``: a worker's, a test's or a single-model tool's keys).
    ``deadline``: when batch work is due (None: ``worker.jobs.enqueue`` gives it the
    default; interactive work has none)."""

    request: dict[str, Any]
    tenant: str = "default"
    queue_class: str = "batch"
    model: str | None = None
    priority: int = 0
    custom_id: str | None = None
    batch_id: str | None = None
    id: str = ""
    max_tokens: int | None = None  # output tokens the request allows, all samples (or None)
    deadline: datetime | None = None


@dataclass
class JobResult:
    """The end of one job as a worker writes it: status plus result and timeline."""

    job_id: str
    status: str  # succeeded | failed | cancelled
    text: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None
    started_at: datetime | None = (
        None  # first scheduled in the engine (None: keep the pick-up time)
    )
    first_token_at: datetime | None = None
    finished_at: datetime | None = None
    first_step: int | None = None
    last_step: int | None = None
    isolation: str | None = None  # why it ran isolated from the normal batch, if it did
    choices: list[dict[str, Any]] | None = None  # every sample (stored_choice); None: none
    cached_tokens: int | None = None  # prompt tokens the prefix cache served (not computed)
    engine_seconds: float | None = None  # its share of the engine steps' wall time


@dataclass
class ModelInfo:
    """What a worker serves, as it registers it: plain values taken from its engine."""

    model_id: str  # the --model spec, or a local path's name
    model_type: str | None = None  # config.model_type, e.g. "llama"
    architecture: str | None = None  # config.architectures[0], e.g. "LlamaForCausalLM"
    dtype: str | None = None  # e.g. "float32"
    max_model_len: int | None = None  # the engine's context length
