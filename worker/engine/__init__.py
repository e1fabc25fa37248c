"""The inflight engine: continuous batching over paged KV, usable on its own in-process."""

from worker.engine.config import EngineArgs
from worker.engine.llm import LLM
from worker.engine.llm_engine import LLMEngine
from worker.engine.outputs import RequestMetrics, RequestOutput, StepStats, TokenLogprob
from worker.protocol.sampling_params import InvalidRequestError, SamplingParams

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
