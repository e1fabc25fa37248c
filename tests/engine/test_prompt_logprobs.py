"""Prompt logprobs (scoring a given text): every prompt token after the first gets its
log-probability under Hugging Face's forward, its rank and the top alternatives, whether
the prompt runs in one chunk or many, after a prefix-cache hit of another request, after
a preemption, and beside plain requests in one batch."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import hf_model, prompt_token_lists
from worker.engine import LLM, SamplingParams
from worker.protocol.openai_batch import (
    build_response_body,
    choice_from_stored,
    parse_request_body,
    samples_of,
    stored_choice,
)

SPEC = "tiny-llama"
TOP = 3


def _hf_scores(prompt: list[int]) -> torch.Tensor:
    """``[len(prompt) - 1, vocab]``: log_softmax of HF's logits predicting tokens 1.. ."""
    with torch.inference_mode():
        logits = hf_model(SPEC)(torch.tensor([prompt])).logits[0, :-1].float()  # [P-1, vocab]
    return torch.log_softmax(logits, dim=-1)


def _check(prompt: list[int], scored: list, top: int = TOP) -> None:
    assert scored is not None and len(scored) == len(prompt) and scored[0] is None
    ref = _hf_scores(prompt)
    for pos in range(1, len(prompt)):
        entry, row = scored[pos], ref[pos - 1]
        assert entry.token_id == prompt[pos]
        assert entry.logprob == pytest.approx(float(row[prompt[pos]]), abs=2e-4)
        assert entry.rank == int((row > row[prompt[pos]]).sum()) + 1
        want = torch.topk(row, top)
        assert list(entry.top) == want.indices.tolist()
        assert list(entry.top.values()) == pytest.approx(want.values.tolist(), abs=2e-4)


def _params(max_tokens: int = 4, prompt_logprobs: int | None = TOP) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                          prompt_logprobs=prompt_logprobs)


@pytest.mark.parametrize("budget", [2048, 7], ids=["one-chunk", "chunks-of-7"])
def test_prompt_scores_equal_hf_beside_plain_requests(budget: int) -> None:
    llm = LLM(SPEC, num_kv_blocks=128, max_num_seqs=8, max_num_batched_tokens=budget)
    prompts = prompt_token_lists(llm.tokenizer, 6, lo=5, hi=60)
    params = [_params(prompt_logprobs=TOP if i % 2 == 0 else None) for i in range(len(prompts))]
    outs = llm.generate(prompts, params, use_tqdm=False)
    plain = llm.generate(prompts, _params(prompt_logprobs=None), use_tqdm=False)
    for i, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
        assert out.token_ids == plain[i].token_ids  # scoring changes nothing generated
        if i % 2:
            assert out.prompt_logprobs is None
        else:
            _check(prompt, out.prompt_logprobs)


def test_a_cached_prefix_is_scored_again_and_a_preempted_prompt_once() -> None:
    # 5 blocks of 16: the two 40-token prompts cannot both hold their KV, so one is preempted
    llm = LLM(SPEC, num_kv_blocks=6, block_size=16, max_num_seqs=2, max_num_batched_tokens=64)
    base = prompt_token_lists(llm.tokenizer, 1, lo=40, hi=41)[0]
    llm.generate([base], _params(prompt_logprobs=None), use_tqdm=False)  # publishes its blocks
    other = base[:32] + prompt_token_lists(llm.tokenizer, 1, lo=8, hi=9)[0]
    outs = llm.generate([base, other], _params(max_tokens=30), use_tqdm=False)
    for prompt, out in zip([base, other], outs, strict=True):
        _check(prompt, out.prompt_logprobs)


def test_n_samples_share_one_prompt_score_and_zero_top_gives_rank_only() -> None:
    llm = LLM(SPEC, num_kv_blocks=64, max_num_seqs=8)
    prompt = prompt_token_lists(llm.tokenizer, 1, lo=12, hi=13)[0]
    params = SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=3, prompt_logprobs=0)
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    assert len(out.samples) == 3
    _check(prompt, out.prompt_logprobs, top=0)
    assert all(entry.top == {} for entry in out.prompt_logprobs[1:])


def test_the_response_carries_prompt_scores_where_vllm_does() -> None:
    llm = LLM(SPEC, num_kv_blocks=64, max_num_seqs=4)
    prompt = prompt_token_lists(llm.tokenizer, 1, lo=6, hi=7)[0]
    out = llm.generate([prompt], _params(max_tokens=2, prompt_logprobs=2), use_tqdm=False)[0]
    samples = samples_of(out, llm.tokenizer)
    stored = [choice_from_stored(stored_choice(s)) for s in samples]  # through the job store
    common = dict(request_id="r", model="m", prompt_tokens=len(prompt), completion_tokens=2,
                  created=0, with_logprobs=False)
    completion = build_response_body(is_chat=False, choices=stored, **common)
    scores = completion["choices"][0]["prompt_logprobs"]
    assert scores[0] is None and len(scores) == len(prompt)
    first = scores[1]
    actual = first[str(prompt[1])]
    assert next(iter(first)) == str(prompt[1])  # the prompt's own token first
    assert actual["logprob"] == pytest.approx(out.prompt_logprobs[1].logprob)
    assert actual["rank"] == out.prompt_logprobs[1].rank
    assert actual["decoded_token"] == llm.tokenizer.decode([prompt[1]])
    assert {e["rank"] for t, e in first.items() if t != str(prompt[1])} <= {1, 2}
    chat = build_response_body(is_chat=True, choices=stored, **common)
    assert chat["prompt_logprobs"] == scores and "prompt_logprobs" not in chat["choices"][0]
    plain = build_response_body(is_chat=False, choices=samples_of(
        llm.generate([prompt], _params(max_tokens=2, prompt_logprobs=None), use_tqdm=False)[0],
        llm.tokenizer), **common)
    assert "prompt_logprobs" not in plain["choices"][0]


def test_prompt_logprobs_is_a_bounded_body_field_on_both_endpoints() -> None:
    req = parse_request_body({"prompt": "score me", "max_tokens": 1, "prompt_logprobs": 5},
                             endpoint="/v1/completions")
    assert req.params.prompt_logprobs == 5
    chat = parse_request_body({"messages": [{"role": "user", "content": "hi"}],
                               "prompt_logprobs": 0}, endpoint="/v1/chat/completions")
    assert chat.params.prompt_logprobs == 0
    from worker.protocol.openai_batch import RequestParseError

    for bad in (21, -1, 1.5, True):
        with pytest.raises(RequestParseError) as err:
            parse_request_body({"prompt": "x", "prompt_logprobs": bad}, endpoint="/v1/completions")
        assert err.value.param == "prompt_logprobs"


def test_openai_fields_we_do_not_serve_are_refused_with_what_to_ask_instead() -> None:
    from worker.protocol.openai_batch import RequestParseError

    for name, value in (("best_of", 4), ("echo", True), ("suffix", "x")):
        with pytest.raises(RequestParseError) as err:
            parse_request_body({"prompt": "x", name: value}, endpoint="/v1/completions")
        assert err.value.param == name and err.value.code == "unsupported_field"
        assert "not supported" in str(err.value)
