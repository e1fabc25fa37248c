"""The native decode stack (``worker/engine/models/native_stack.py``): the families it covers
take it on every decode step and give the Python loop's logits bit for bit; the rest, and
steps with prefill tokens, stay on the loop. (Greedy parity with transformers through the
stack is ``test_model_families.py``: the engine takes the stack there.)"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import prompt_token_lists
from worker.engine import LLMEngine, SamplingParams
from worker.engine.models.native_stack import STACK_ENV, NativeDecodeStack, unsupported
from worker.engine.models.tiny import TINY_ARCHS

STACKED = ("llama", "qwen2", "llama3", "mistral", "qwen3", "phi3", "granite", "smollm3")
LOOPED = {"gemma2": "layout sandwich", "gemma3": "layout sandwich", "phi4mini": "partial rotary",
          "olmo2": "layout post", "qwen3moe": "mixture-of-experts", "mixtral": "mixture-of-experts"}


def test_every_tiny_family_is_placed() -> None:
    assert sorted((*STACKED, *LOOPED)) == sorted(TINY_ARCHS)


def engine_for(arch: str) -> LLMEngine:
    return LLMEngine(model=f"tiny-{arch}", num_kv_blocks=64, max_num_seqs=4, max_num_batched_tokens=64)


@pytest.mark.parametrize("arch", STACKED)
def test_decode_steps_take_the_stack_and_equal_the_loop(arch: str) -> None:
    """Ragged contexts longer than the tiny windows; each decode step's inputs are run again
    through the stack and through the loop (rewriting the same K/V), and the logits match."""
    engine = engine_for(arch)
    model, runner = engine.runner.model, engine.runner
    stack = model.native_stack
    assert isinstance(stack, NativeDecodeStack)
    runs = 0
    stack_run = stack.run

    def counted(*args, **kwargs):
        nonlocal runs
        runs += 1
        return stack_run(*args, **kwargs)

    stack.run = counted  # type: ignore[method-assign]
    steps: list = []
    build = runner.build_inputs

    def captured(plan):
        inputs = build(plan)
        steps.append(inputs)
        return inputs

    runner.build_inputs = captured  # type: ignore[method-assign]
    prompts = prompt_token_lists(engine.tokenizer, 3, seed=11, lo=21, hi=70)
    for i, (prompt, n) in enumerate(zip(prompts, (5, 9, 14), strict=True)):
        engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    compared = 0
    while engine.has_unfinished_requests():
        steps.clear()
        engine.step()
        ((ids, meta),) = steps
        if meta.num_decode_seqs != ids.shape[0]:
            continue
        pauses = 0

        def pause() -> None:  # where the service would run an interjected step
            nonlocal pauses
            pauses += 1

        with torch.inference_mode():
            before = runs
            stacked = model(ids, meta, runner.kv_caches, runner.backend)
            assert runs == before + 1, "a decode step did not take the stack"
            paused = model(ids, meta, runner.kv_caches, runner.backend, between_layers=pause)
            assert runs == before + 2, "a step that may pause did not take the stack"
            assert pauses == len(model.decoder_layers) - 1  # after every layer but the last
            model.native_stack = None
            looped = model(ids, meta, runner.kv_caches, runner.backend)
            model.native_stack = stack
        assert torch.equal(stacked, looped), f"{arch}: {ids.shape[0]} sequences"
        assert torch.equal(paused, looped), f"{arch}: {ids.shape[0]} sequences, one layer per call"
        compared += 1
    assert compared >= 8  # batches of 3, 2 and 1 sequences
    assert runs >= 3 * compared  # the engine's own decode steps took it too


def test_a_layer_range_outside_the_stack_is_refused() -> None:
    engine = engine_for("llama")
    stack = engine.runner.model.native_stack
    assert isinstance(stack, NativeDecodeStack)
    n, hidden = stack.num_layers, torch.zeros(1, engine.runner.model.config.hidden_size)
    empty = torch.empty(0)
    step = (hidden, torch.zeros(1, 8), torch.zeros(1, 8), torch.zeros(1, dtype=torch.long),
            torch.zeros(1, 1, dtype=torch.long), torch.ones(1, dtype=torch.long))
    with pytest.raises(RuntimeError, match="not a range"):
        stack.stack.run(*step, empty, 0, n + 1)
    with pytest.raises(RuntimeError, match="not a range"):
        stack.stack.run(*step, empty, 1, 1)
    with pytest.raises(RuntimeError, match="exactly when begin > 0"):
        stack.stack.run(*step, empty, 1, 2)  # a later layer without the previous one's output
    with pytest.raises(RuntimeError, match="exactly when begin > 0"):
        stack.stack.run(*step, torch.zeros_like(hidden), 0, 1)  # the first layer with one
    with pytest.raises(RuntimeError, match="shaped like hidden"):
        stack.stack.run(*step, torch.zeros(2, hidden.shape[1]), 1, 2)


def test_steps_with_prefill_tokens_stay_on_the_loop() -> None:
    engine = engine_for("llama")
    stack = engine.runner.model.native_stack
    assert stack is not None
    calls = 0

    def refuse(*args, **kwargs):
        nonlocal calls
        calls += 1
        raise AssertionError("a prefill step took the stack")

    stack.run = refuse  # type: ignore[method-assign]
    engine.add_request("r", list(range(5, 40)), SamplingParams(temperature=0.0, max_tokens=1))
    outputs, stats = engine.step()
    assert stats.num_prefill_tokens > 0 and calls == 0 and outputs[0].finished


@pytest.mark.parametrize("arch", sorted(LOOPED))
def test_other_layouts_stay_on_the_loop_and_say_why(arch: str) -> None:
    runner = engine_for(arch).runner
    assert runner.model.native_stack is None
    reason = unsupported(runner.model, runner.kv_caches)
    assert reason is not None and LOOPED[arch] in reason


def test_the_stack_can_be_switched_off(monkeypatch) -> None:
    monkeypatch.setenv(STACK_ENV, "off")
    assert engine_for("llama").runner.model.native_stack is None
    monkeypatch.setenv(STACK_ENV, "sometimes")
    with pytest.raises(ValueError, match=STACK_ENV):
        engine_for("llama")


def test_a_model_not_packed_for_the_native_kernels_stays_on_the_loop() -> None:
    runner = LLMEngine(model="tiny-llama", num_kv_blocks=16, max_num_seqs=2, prepack_weights=False).runner
    assert runner.model.native_stack is None
    assert unsupported(runner.model, runner.kv_caches) == "weights not packed into the native panels"
