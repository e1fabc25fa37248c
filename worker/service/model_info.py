"""What this worker serves, read once from its built engine and turned into plain strings
and ints for its ``workers`` row (``GET /v1/models``, ``inflight models``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from worker.store.schemas import ModelInfo


def model_id_for(spec: str) -> str:
    """The id clients name the model by: the ``--model`` spec (an alias such as
    ``smollm2-135m``, or a hub id), or the name of a local path (directory or .gguf file)."""
    path = Path(spec).expanduser()
    if spec.startswith((".", "/", "~")) or path.exists():
        return Path(os.path.abspath(path)).name or spec
    return spec


def _text(value: Any, limit: int) -> str | None:
    return str(value)[:limit] if value else None


def describe_engine(engine: Any, spec: str, model_id: str | None = None) -> ModelInfo:
    """The model info of ``engine`` built from ``spec`` and served as ``model_id`` (default:
    :func:`model_id_for` the spec): its runner's transformers config
    (``model_type``, ``architectures[0]``), dtype (``float32``, without ``torch.``) and
    ``max_model_len``. An engine without a runner (a test double) gives the id alone."""
    runner = getattr(engine, "runner", None)
    config = getattr(runner, "config", None)
    architectures = getattr(config, "architectures", None) or []
    dtype = getattr(runner, "dtype", None)
    max_len = getattr(runner, "max_model_len", None)
    return ModelInfo(
        model_id=model_id or model_id_for(spec),
        model_type=_text(getattr(config, "model_type", None), 64),
        architecture=_text(architectures[0], 255) if architectures else None,
        dtype=_text(str(dtype).removeprefix("torch."), 32) if dtype is not None else None,
        max_model_len=int(max_len) if isinstance(max_len, int) else None,
    )
