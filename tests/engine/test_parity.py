"""Greedy output equals Hugging Face generate, and does not depend on the batch."""

from __future__ import annotations

import pytest

from tests.conftest import hf_greedy, prompt_token_lists
from worker.engine import LLM, SamplingParams

NEW_TOKENS = 48


def _greedy(max_tokens: int = NEW_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


@pytest.mark.parametrize("speculative", [0, 4], ids=["plain", "ngram-drafts"])
@pytest.mark.parametrize("spec", ["tiny-llama", "tiny-qwen2"])
def test_greedy_equals_hf_generate_tiny(spec: str, speculative: int) -> None:
    llm = LLM(spec, num_kv_blocks=128, max_num_seqs=16, num_speculative_tokens=speculative)
    prompts = prompt_token_lists(llm.tokenizer, 8)
    outputs = llm.generate(prompts, _greedy(), use_tqdm=False)
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out.token_ids == hf_greedy(spec, prompt, NEW_TOKENS), f"prompt of {len(prompt)} tokens"
        assert out.finish_reason == "length"


@pytest.mark.slow
@pytest.mark.parametrize("speculative", [0, 4], ids=["plain", "ngram-drafts"])
def test_greedy_equals_hf_generate_smollm2(speculative: int) -> None:
    llm = LLM("smollm2-135m", num_kv_blocks=256, max_num_seqs=16, num_speculative_tokens=speculative)
    prompts = prompt_token_lists(llm.tokenizer, 8, lo=4, hi=120)
    outputs = llm.generate(prompts, _greedy(), use_tqdm=False)
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out.token_ids == hf_greedy("smollm2-135m", prompt, NEW_TOKENS), f"prompt of {len(prompt)} tokens"
    if speculative:  # the drafts really ran: SmolLM2 repeats itself on these prompts
        assert llm.engine.total_accepted_tokens > 0


def test_batch_invariance_greedy_and_seeded(tiny_llama_engine) -> None:
    from worker.engine.llm import LLM as _LLM

    llm = _LLM.__new__(_LLM)
    llm.engine, llm._counter = tiny_llama_engine, 0
    prompts = prompt_token_lists(llm.tokenizer, 32, seed=1, lo=2, hi=90)
    greedy = [_greedy(24)] * 32
    seeded = [SamplingParams(temperature=0.9, top_p=0.95, seed=100 + i, max_tokens=24, ignore_eos=True) for i in range(32)]
    batch_greedy = llm.generate(prompts, greedy, use_tqdm=False)
    batch_seeded = llm.generate(prompts, seeded, use_tqdm=False)
    for i in (0, 7, 31):
        alone_greedy = llm.generate([prompts[i]], greedy[i], use_tqdm=False)[0]
        alone_seeded = llm.generate([prompts[i]], seeded[i], use_tqdm=False)[0]
        assert alone_greedy.token_ids == batch_greedy[i].token_ids
        assert alone_seeded.token_ids == batch_seeded[i].token_ids
    # seeded sampling really samples: not all outputs equal their greedy counterparts
    assert any(s.token_ids != g.token_ids for s, g in zip(batch_seeded, batch_greedy, strict=True))
    assert not tiny_llama_engine.has_unfinished_requests()


def test_static_policy_gives_the_same_greedy_outputs() -> None:
    prompts = None
    results = {}
    for policy in ("fcfs", "static"):
        llm = LLM("tiny-llama", num_kv_blocks=128, max_num_seqs=4, policy=policy)
        prompts = prompts or prompt_token_lists(llm.tokenizer, 10, seed=2)
        params = [_greedy(8 + 3 * i) for i in range(len(prompts))]
        results[policy] = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert results["fcfs"] == results["static"]
