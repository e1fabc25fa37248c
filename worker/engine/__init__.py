"""The inflight engine: continuous batching over paged KV, usable on its own in-process.

The names below load on first use, so importing a torch-free module of this package (the
output types of ``worker.engine.outputs``, say) does not load torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from worker.engine.config import EngineArgs
    from worker.engine.llm import LLM
    from worker.engine.llm_engine import LLMEngine
    from worker.engine.outputs import RequestMetrics, RequestOutput, StepStats, TokenLogprob
    from worker.protocol.sampling_params import InvalidRequestError, SamplingParams

_HOMES = {
    "LLM": "worker.engine.llm",
    "EngineArgs": "worker.engine.config",
    "InvalidRequestError": "worker.protocol.sampling_params",
    "LLMEngine": "worker.engine.llm_engine",
    "RequestMetrics": "worker.engine.outputs",
    "RequestOutput": "worker.engine.outputs",
    "SamplingParams": "worker.protocol.sampling_params",
    "StepStats": "worker.engine.outputs",
    "TokenLogprob": "worker.engine.outputs",
}

__all__ = [
    "LLM",
    "EngineArgs",
    "InvalidRequestError",
    "LLMEngine",
    "RequestMetrics",
    "RequestOutput",
    "SamplingParams",
    "StepStats",
    "TokenLogprob",
]


def __getattr__(name: str) -> Any:
    """Load one of the package's public names from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'worker.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
