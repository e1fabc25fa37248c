"""benchmarks/stack_builds.py on the tiny model: builds alternate on one running batch, every
timed step runs every sequence, and two builds of the decode stack live in one process."""

from __future__ import annotations

import pytest

from benchmarks import stack_builds
from benchmarks.linear_builds import variant_flags
from kernels import cpu_native
from worker.engine.config import EngineArgs
from worker.engine.llm_engine import LLMEngine
from worker.engine.models.native_stack import NativeDecodeStack


def test_variant_flags_are_macros_and_anything_else_is_refused() -> None:
    assert variant_flags("ATTN_PREFETCH_BLOCKS=4+LINEAR_MC_ROWS=256") == (
        "-DATTN_PREFETCH_BLOCKS=4", "-DLINEAR_MC_ROWS=256")
    with pytest.raises(ValueError, match="NAME=VALUE"):
        variant_flags("-O0")
    with pytest.raises(ValueError, match="NAME=VALUE"):
        variant_flags("ATTN_PREFETCH_BLOCKS=4+")


def test_two_builds_alternate_on_one_running_batch() -> None:
    engine = LLMEngine(EngineArgs(model="tiny-llama", max_num_seqs=4, num_threads=1,
                                  max_num_batched_tokens=256, num_kv_blocks=256))
    model = engine.runner.model
    assert model.native_stack is not None
    isa = cpu_native.default_isa()
    # a macro at its default value: the same code under another build name, loaded beside
    # the shipped build (each module keeps its own DecoderStack type)
    stacks = {name: NativeDecodeStack(model, engine.runner.kv_caches, stack_builds.build_stack(name, isa)).stack
              for name in ("default", "ATTN_PREFETCH_BLOCKS=2")}
    assert type(stacks["default"]) is not type(stacks["ATTN_PREFETCH_BLOCKS=2"])
    times = stack_builds.alternate(engine, stacks, batch=3, context=40, steps=2, rounds=3)
    assert {name: len(t) for name, t in times.items()} == {"default": 3, "ATTN_PREFETCH_BLOCKS=2": 3}
    assert all(t > 0 for ts in times.values() for t in ts)
    assert not engine.has_unfinished_requests()  # the batch was aborted after the rounds
    native = model.native_stack
    assert isinstance(native, NativeDecodeStack)
    assert native.stack is stacks["ATTN_PREFETCH_BLOCKS=2"]  # the last build timed


def test_alternate_refuses_an_engine_without_the_native_stack() -> None:
    engine = LLMEngine(EngineArgs(model="tiny-llama", max_num_seqs=2, num_threads=1,
                                  max_num_batched_tokens=256, num_kv_blocks=64))
    engine.runner.model.native_stack = None
    with pytest.raises(RuntimeError, match="no native decode stack"):
        stack_builds.alternate(engine, {"default": object()}, batch=1, context=8, steps=1, rounds=1)
