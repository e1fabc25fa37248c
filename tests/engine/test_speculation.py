"""N-gram speculative decoding: drafts, acceptance, and outputs equal to plain greedy."""

from __future__ import annotations

import pytest

from tests.conftest import prompt_token_lists
from worker.engine import LLM, SamplingParams
from worker.engine.ngram_proposer import NgramIndex
from worker.engine.speculation import accept


def test_ngram_index_proposes_what_followed_the_last_occurrence() -> None:
    index = NgramIndex(min_n=2, max_n=3)
    # (7, 8) last occurred at positions 3-4, followed by 9 1 7 8 -> period 4 continues.
    assert index.propose([1, 2, 7, 8, 9, 1, 7, 8], 6) == [9, 1, 7, 8, 9, 1]
    assert index.propose([4, 5, 6], 3) == []  # nothing recurs
    assert NgramIndex(2, 2).propose([5, 5, 5], 3) == [5, 5, 5]  # period 1
    assert NgramIndex(2, 2).propose([5, 5, 5], 0) == []


def test_ngram_index_is_incremental_and_prefers_longer_matches() -> None:
    tokens = [1, 2, 3, 9, 2, 3, 4, 1, 2, 3]
    index = NgramIndex(min_n=2, max_n=3)
    # the 3-gram (1, 2, 3) matches at 0-2 (-> 9), the 2-gram (2, 3) more recently (-> 4)
    assert index.propose(tokens, 2) == [9, 2]
    tokens += [9, 2]
    assert index.propose(tokens, 2) == [3, 4]  # (9, 2) -> 3 4, found through the update
    assert index.indexed_upto == len(tokens) - 1


def test_accept_keeps_the_agreeing_prefix_and_the_next_token() -> None:
    assert accept([1, 2, 3], [1, 2, 9, 4]) == [1, 2, 9]
    assert accept([1, 2, 3], [1, 2, 3, 4]) == [1, 2, 3, 4]
    assert accept([5], [6, 7]) == [6]


def _loop_prompts(tokenizer, count: int) -> list[list[int]]:
    """Prompts that repeat a phrase, so the n-gram drafter has something to find."""
    base = prompt_token_lists(tokenizer, count, seed=4, lo=3, hi=12)
    return [(p * 5)[:50] for p in base]


@pytest.mark.parametrize("max_rows", [64, 12])
def test_outputs_equal_plain_greedy_with_mixed_requests(max_rows: int) -> None:
    plain = LLM("tiny-llama", num_kv_blocks=256, max_num_seqs=8)
    spec = LLM("tiny-llama", num_kv_blocks=256, max_num_seqs=8, num_speculative_tokens=4,
               speculative_max_rows=max_rows)
    prompts = _loop_prompts(plain.tokenizer, 10)
    params = [SamplingParams(temperature=0.0, max_tokens=12 + 5 * i, ignore_eos=True) for i in range(10)]
    # requests drafts must leave alone: sampled, logprobs, penalties, n > 1, min_tokens
    params[1] = SamplingParams(temperature=0.8, seed=3, max_tokens=20, ignore_eos=True)
    params[2] = SamplingParams(temperature=0.0, logprobs=2, max_tokens=20, ignore_eos=True)
    params[3] = SamplingParams(temperature=0.0, repetition_penalty=1.3, max_tokens=20, ignore_eos=True)
    params[4] = SamplingParams(temperature=0.7, n=2, seed=5, max_tokens=15, ignore_eos=True)
    params[5] = SamplingParams(temperature=0.0, min_tokens=9, max_tokens=30)
    want = plain.generate(prompts, params, use_tqdm=False)
    got = spec.generate(prompts, params, use_tqdm=False)
    for w, g in zip(want, got, strict=True):
        assert g.token_ids == w.token_ids
        assert g.finish_reason == w.finish_reason
        assert [s.token_ids for s in g.samples or []] == [s.token_ids for s in w.samples or []]
    assert spec.engine.total_accepted_tokens > 0
    assert spec.engine.total_draft_tokens >= spec.engine.total_accepted_tokens
    assert not spec.engine.has_unfinished_requests()
    assert spec.engine.block_manager.num_used_blocks == 0


def test_drafts_survive_preemption_prefix_caching_and_stop_strings() -> None:
    kwargs = dict(num_kv_blocks=14, block_size=16, max_num_seqs=6, enable_prefix_caching=True)
    plain = LLM("tiny-llama", **kwargs)
    spec = LLM("tiny-llama", num_speculative_tokens=3, **kwargs)
    prompts = _loop_prompts(plain.tokenizer, 6)
    params = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True) for _ in prompts]
    first = plain.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=40), use_tqdm=False)[0]
    if len(first.text) > 4:  # a stop string taken from the plain output ends one request early
        params[0] = SamplingParams(temperature=0.0, max_tokens=40, stop=[first.text[2:5]])
    want = plain.generate(prompts, params, use_tqdm=False)
    got = spec.generate(prompts, params, use_tqdm=False)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert [g.text for g in got] == [w.text for w in want]
    assert any(g.metrics.num_preemptions for g in got)  # the small pool forced recompute
    assert spec.engine.total_accepted_tokens > 0


def test_drafts_are_dropped_rather_than_preempting_another_sequence() -> None:
    from tests.engine.test_policies import make_scheduler, make_seq, step

    sched = make_scheduler("fcfs", blocks=4, seqs=2)  # 4 blocks of 4 tokens
    a, b = make_seq(7, 20), make_seq(7, 20)
    sched.add(a)
    sched.add(b)
    step(sched)  # both prefill: 7 tokens + the sampled one = 2 blocks each, pool full
    assert sched.block_manager.num_free_blocks == 0
    a.draft_token_ids = [7, 7, 7]  # would need a third block
    out = sched.schedule(0, 0.0)
    assert not out.preempted  # the guesses went, not b
    assert [s.num_draft_tokens for s in out.scheduled] == [0, 0]
    assert a.draft_token_ids == []


def test_drafts_that_fit_in_free_blocks_are_kept() -> None:
    from tests.engine.test_policies import make_scheduler, make_seq, step

    sched = make_scheduler("fcfs", blocks=8, seqs=2)
    a = make_seq(7, 20)
    sched.add(a)
    step(sched)
    a.draft_token_ids = [7, 7, 7]
    out = sched.schedule(0, 0.0)
    assert [(s.num_new_tokens, s.num_draft_tokens) for s in out.scheduled] == [(4, 3)]


def test_generate_refuses_non_integer_token_ids_and_takes_numpy_ints() -> None:
    import numpy as np

    from worker.protocol.sampling_params import InvalidRequestError

    llm = LLM("tiny-llama", num_kv_blocks=32)
    params = SamplingParams(temperature=0.0, max_tokens=3)
    for bad in ([1.7, 2.0], [True, 5]):
        with pytest.raises(InvalidRequestError, match="token ids must be integers"):
            llm.generate([bad], params, use_tqdm=False)
    out = llm.generate([np.array([5, 6, 7])], params, use_tqdm=False)[0]
    assert out.prompt_token_ids == [5, 6, 7] and len(out.token_ids) == 3
