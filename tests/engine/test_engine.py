"""Engine guarantees on the tiny model: refusals, chunking, preemption, caching, aborts."""

from __future__ import annotations

import pytest

from tests.conftest import prompt_token_lists
from worker.engine import LLM, InvalidRequestError, LLMEngine, SamplingParams


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def run_all(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams]) -> tuple[list[list[int]], int]:
    """Generate all prompts; return their outputs in order and the preemptions seen."""
    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"r{i}", p, sp)
    done: dict[str, list[int]] = {}
    preemptions = 0
    while engine.has_unfinished_requests():
        outputs, stats = engine.step()
        preemptions += stats.num_preemptions
        assert stats.kv_blocks_used <= stats.kv_blocks_total
        for out in outputs:
            if out.finished:
                done[out.request_id] = out.token_ids
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return [done[f"r{i}"] for i in range(len(prompts))], preemptions


@pytest.fixture(scope="module")
def reference_outputs():
    engine = LLMEngine(model="tiny-llama", num_kv_blocks=512, max_num_seqs=32)
    prompts = prompt_token_lists(engine.tokenizer, 12, seed=5, lo=5, hi=70)
    params = [greedy(10 + 4 * i) for i in range(len(prompts))]
    outputs, preemptions = run_all(engine, prompts, params)
    assert preemptions == 0
    return prompts, params, outputs


def test_refusals_are_clear_and_others_go_on() -> None:
    engine = LLMEngine(model="tiny-llama", num_kv_blocks=8, block_size=16, max_model_len=200)
    with pytest.raises(InvalidRequestError, match="exceeds the context of 200"):
        engine.add_request("long", [5] * 150, greedy(60))
    with pytest.raises(InvalidRequestError, match="whole pool holds"):
        engine.add_request("big", [5] * 100, greedy(40))  # 140 tokens > 8 blocks x 16
    with pytest.raises(InvalidRequestError, match="empty"):
        engine.add_request("empty", [], greedy(4))
    with pytest.raises(InvalidRequestError, match="token ids must be integers"):
        engine.add_request("vocab", [10**9], greedy(4))
    with pytest.raises(InvalidRequestError, match="temperature"):
        SamplingParams(temperature=-1)
    engine.add_request("ok", [5, 6, 7], greedy(5))
    with pytest.raises(InvalidRequestError, match="already in the engine"):
        engine.add_request("ok", [5, 6, 7], greedy(5))
    outputs = []
    while engine.has_unfinished_requests():
        outputs += [o for o in engine.step()[0] if o.finished]
    assert [(o.request_id, len(o.token_ids), o.finish_reason) for o in outputs] == [("ok", 5, "length")]


def test_chunked_prefill_gives_the_same_outputs(reference_outputs) -> None:
    prompts, params, expected = reference_outputs
    engine = LLMEngine(model="tiny-llama", num_kv_blocks=512, max_num_seqs=32, max_num_batched_tokens=16)
    outputs, _ = run_all(engine, prompts, params)
    assert outputs == expected


def test_preemption_under_a_small_pool_loses_nothing(reference_outputs) -> None:
    prompts, params, expected = reference_outputs
    engine = LLMEngine(model="tiny-llama", num_kv_blocks=14, max_num_seqs=32)
    outputs, preemptions = run_all(engine, prompts, params)
    assert preemptions > 0
    assert outputs == expected


def test_prefix_caching_gives_the_same_outputs_and_hits() -> None:
    engine = LLMEngine(model="tiny-llama", num_kv_blocks=256, enable_prefix_caching=True)
    shared = prompt_token_lists(engine.tokenizer, 1, seed=9, lo=40, hi=40)[0] * 2  # 80 tokens
    prompts = [[*shared, 7 + i, 9, 11 + i] for i in range(6)]
    params = [greedy(12)] * 6
    cold = LLMEngine(model="tiny-llama", num_kv_blocks=256, enable_prefix_caching=False)
    expected, _ = run_all(cold, prompts, params)
    engine.add_request("warm", prompts[0], greedy(1))
    while engine.has_unfinished_requests():
        engine.step()
    cached = 0
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params[i])
    done = {}
    while engine.has_unfinished_requests():
        outputs, stats = engine.step()
        cached += stats.num_cached_tokens
        done.update({o.request_id: o.token_ids for o in outputs if o.finished})
    assert [done[f"r{i}"] for i in range(6)] == expected
    assert cached >= 6 * 64  # at least the four full shared blocks of every request


def test_abort_frees_blocks_and_reports_abort(tiny_llama_engine) -> None:
    engine = tiny_llama_engine
    engine.add_request("keep", [3, 4, 5, 6], greedy(6))
    engine.add_request("drop", [3, 4, 5, 6] * 10, greedy(50))
    engine.step()
    engine.abort_request("drop")
    finished = {}
    while engine.has_unfinished_requests():
        finished.update({o.request_id: o for o in engine.step()[0] if o.finished})
    assert finished["drop"].finish_reason == "abort"
    assert finished["keep"].finish_reason == "length" and len(finished["keep"].token_ids) == 6
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_stop_token_ids_end_with_reason_stop() -> None:
    llm = LLM("tiny-llama", num_kv_blocks=64)
    free_run = llm.generate([[5, 6, 7]], greedy(30), use_tqdm=False)[0]
    stopper = free_run.token_ids[3]
    params = SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[stopper])
    stopped = llm.generate([[5, 6, 7]], params, use_tqdm=False)[0]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stopper
    assert stopped.token_ids == free_run.token_ids[: free_run.token_ids.index(stopper) + 1]


def test_sixty_four_requests_in_sixty_four_blocks_all_finish_unchanged() -> None:
    roomy = LLMEngine(model="tiny-llama", num_kv_blocks=1024, max_num_seqs=64)
    prompts = prompt_token_lists(roomy.tokenizer, 64, seed=11, lo=4, hi=40)
    params = [greedy(8 + (i * 7) % 33) for i in range(64)]
    expected, none = run_all(roomy, prompts, params)
    tight = LLMEngine(model="tiny-llama", num_kv_blocks=64, max_num_seqs=64)
    outputs, preemptions = run_all(tight, prompts, params)
    print(f"preemptions with 64 blocks: {preemptions}")
    assert none == 0 and preemptions > 0
    assert outputs == expected


def test_stop_string_at_the_very_start_gives_empty_text() -> None:
    llm = LLM("tiny-llama", num_kv_blocks=64)
    free_run = llm.generate([[5, 6, 7]], greedy(12), use_tqdm=False)[0]
    first_piece = llm.tokenizer.decode(free_run.token_ids[:1])
    assert first_piece.strip(), "the first token must decode to visible text"
    params = SamplingParams(temperature=0.0, max_tokens=12, stop=[first_piece])
    out = llm.generate([[5, 6, 7]], params, use_tqdm=False)[0]
    assert out.finish_reason == "stop" and out.stop_reason == first_piece
    assert out.text == ""
