"""Blocks that slid out of every layer's sliding window are released (block_manager).

Unit tests pin the release bound against the kernels' window rule (the query at p sees
keys p - W < k <= p), the reference counts of shared prefixes and forks, the prefix
cache and swap. End to end, the tiny windowed checkpoints must give Hugging Face's greedy
tokens while each sequence holds only the blocks of its window, in pools too small to
hold the sequences whole, under preemption (recompute and swap), prefix caching and
chunked prefill; the mixed-window Gemma 2 must release nothing.
"""

from __future__ import annotations

import functools
import itertools

import pytest
import torch

from kernels import reference
from tests.conftest import blocks_consistent, hf_greedy, prompt_token_lists
from worker.engine import LLMEngine, SamplingParams
from worker.engine.block_manager import RELEASED, BlockManager, num_released
from worker.engine.outputs import RequestMetrics
from worker.engine.sequence import Sequence
from worker.engine.step_stats import distinct_kv_tokens
from worker.engine.swap import SwapManager, SwapRule

BS = 16
NEW_TOKENS = 60


def make_seq(num_tokens: int, rid: str = "s", offset: int = 0) -> Sequence:
    tokens = [(offset + i) % 500 + 3 for i in range(num_tokens)]
    return Sequence(rid, tokens, SamplingParams(), RequestMetrics(arrival_time=0.0))


def compute(bm: BlockManager, seq: Sequence, num_tokens: int) -> None:
    """Pretend ``num_tokens`` of ``seq`` were computed by a step: grow, publish, release."""
    bm.grow(seq, num_tokens)
    seq.num_computed_tokens = num_tokens
    bm.publish_full_blocks(seq)
    bm.release_out_of_window(seq)


def held(seq: Sequence) -> list[int]:
    return [b for b in seq.block_table if b != RELEASED]


# -- the bound ------------------------------------------------------------------------
@pytest.mark.parametrize("window", [15, 16, 17, 40])
def test_release_bound_is_the_first_key_the_next_query_sees(window: int) -> None:
    bm = BlockManager(64, BS, window=window)
    for c in range(0, 12 * BS):
        # queries at p >= c see keys k > p - window, so keys >= c - window + 1 stay live
        first_live = max(0, c - window + 1)
        dead = [i for i in range(12) if (i + 1) * BS - 1 < first_live]
        assert bm.num_out_of_window(c) == len(dead), f"c={c}"


@pytest.mark.parametrize(("window", "edge"), [(15, 30), (16, 31), (17, 32), (40, 55)])
def test_release_edges(window: int, edge: int) -> None:
    """``edge`` computed tokens: the next query (at ``edge``) sees keys from 16 on, so block
    0 (keys 0..15) is dead; one token fewer and it still sees key 15."""
    bm = BlockManager(64, BS, window=window)
    assert bm.num_out_of_window(edge - 1) == 0
    assert bm.num_out_of_window(edge) == 1
    assert bm.num_out_of_window(edge + BS - 1) == 1
    assert bm.num_out_of_window(edge + BS) == 2
    seq = make_seq(edge + 1)
    compute(bm, seq, edge - 1)
    assert RELEASED not in seq.block_table
    compute(bm, seq, edge)
    assert seq.block_table[0] == RELEASED and RELEASED not in seq.block_table[1:]
    assert blocks_consistent(bm, [seq])


@pytest.mark.parametrize("window", [15, 16, 17, 40])
@pytest.mark.parametrize("q_len", [1, 5], ids=["decode", "chunk"])
def test_reference_kernels_never_read_the_released_entries(window: int, q_len: int) -> None:
    """The queries after ``c`` computed tokens give the same output whether the released
    entries hold their blocks or -1 (an index the kernels would fail on if they read it)."""
    torch.manual_seed(0)
    num_blocks, hkv, heads, dim = 16, 2, 4, 8
    k_cache = torch.randn(num_blocks, BS, hkv, dim)
    v_cache = torch.randn(num_blocks, BS, hkv, dim)
    bm = BlockManager(num_blocks, BS, window=window)
    for c in (window, window + 1, 2 * BS - 1, 2 * BS, 3 * BS + 7, 6 * BS):
        full = list(torch.randperm(num_blocks)[: -(-(c + q_len) // BS)].tolist())
        released = [RELEASED] * bm.num_out_of_window(c) + full[bm.num_out_of_window(c):]
        query = torch.randn(q_len, heads, dim)
        ctx = torch.tensor([c + q_len])
        outs = []
        for table in (full, released):
            bt = torch.tensor([table])
            if q_len == 1:
                outs.append(reference.decode_attention(query, k_cache, v_cache, bt, ctx, 0.3, window=window))
            else:
                cu = torch.tensor([0, q_len])
                outs.append(reference.prefill_attention(query, k_cache, v_cache, bt, cu, ctx, 0.3,
                                                        window=window))
        torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)


def test_no_window_releases_nothing() -> None:
    bm = BlockManager(64, BS)
    seq = make_seq(300)
    compute(bm, seq, 300)
    assert bm.num_out_of_window(10**6) == 0 and bm.release_out_of_window(seq) == 0
    assert RELEASED not in seq.block_table
    with pytest.raises(ValueError):
        BlockManager(4, BS, window=-1)


# -- reference counts ------------------------------------------------------------------
def test_release_frees_blocks_and_free_skips_the_released() -> None:
    bm = BlockManager(32, BS, window=40)
    seq = make_seq(200)
    compute(bm, seq, 100)  # (100 - 40 + 1) // 16 = 3 blocks dead
    assert seq.block_table[:3] == [RELEASED] * 3 and len(seq.block_table) == 7
    assert bm.num_used_blocks == 4 and blocks_consistent(bm, [seq])
    assert bm.release_out_of_window(seq) == 0  # nothing more until it advances
    compute(bm, seq, 117)  # (117 - 39) // 16 = 4
    assert num_released(seq.block_table) == 4 and bm.num_used_blocks == 4
    # indices still count positions: 8 entries span 128 tokens
    assert len(seq.block_table) == 8 and bm.num_new_blocks(seq, 128) == 0
    assert bm.num_new_blocks(seq, 129) == 1
    bm.free(seq)
    assert seq.block_table == [] and bm.num_free_blocks == bm.num_blocks
    assert blocks_consistent(bm, [seq])


def test_shared_prefix_blocks_stay_with_their_other_holder_and_stay_findable() -> None:
    bm = BlockManager(32, BS, enable_prefix_caching=True, window=16)
    first = make_seq(80, "first")
    compute(bm, first, 64)  # (64 - 15) // 16 = 3 released, all published
    published = sorted(bm.cached.values())
    assert num_released(first.block_table) == 3 and len(published) == 4
    assert all(bm.is_free(b) and b in bm.free_cached for b in published[:3])
    second = make_seq(80, "second")
    hits = bm.match_prefix(second)
    assert len(hits) == 4  # released blocks are still found: prefix caching keeps working
    bm.take_cached(second, hits)
    assert blocks_consistent(bm, [first, second])
    shared = hits[3]
    assert bm.ref_counts[shared] == 2
    compute(bm, first, 79)  # first moves on: releases block 3, which second still holds
    assert first.block_table[3] == RELEASED and bm.ref_counts[shared] == 1
    assert not bm.is_free(shared) and blocks_consistent(bm, [first, second])
    bm.release_out_of_window(second)  # 64 computed: blocks 0..2, ref 1 each -> freed again
    assert second.block_table[:3] == [RELEASED] * 3 and blocks_consistent(bm, [first, second])
    bm.free(first)
    bm.free(second)
    assert bm.num_free_blocks == bm.num_blocks and blocks_consistent(bm, [first, second])
    assert len(bm.match_prefix(make_seq(80, "third"))) == 4


def test_forked_samples_keep_blocks_until_every_holder_releases() -> None:
    bm = BlockManager(32, BS, window=17)
    parent = make_seq(70, "parent")
    compute(bm, parent, 40)  # (40 - 16) // 16 = 1 released
    child = make_seq(70, "child")
    bm.fork(parent, child)
    child.num_computed_tokens = parent.num_computed_tokens
    assert child.block_table == parent.block_table and child.block_table[0] == RELEASED
    assert blocks_consistent(bm, [parent, child])
    # the next token lands in the shared partial block: copy on write (block 2)
    assert bm.needs_copy_on_write(child)
    src, dst = bm.copy_on_write(child)
    assert src == parent.block_table[2] and child.block_table[2] == dst
    compute(bm, parent, 64)  # (64 - 16) // 16 = 3: blocks 1 and 2 released too
    assert num_released(parent.block_table) == 3
    block1 = child.block_table[1]
    assert bm.ref_counts[block1] == 1 and not bm.is_free(block1)  # the child still holds it
    compute(bm, child, 64)
    assert bm.is_free(block1) and blocks_consistent(bm, [parent, child])
    bm.free(child)
    bm.free(parent)
    assert bm.num_free_blocks == bm.num_blocks


def test_kept_released_entries_and_publishing_over_them() -> None:
    """A swapped-out sequence keeps its released entries; hashing again from its start
    walks over them and the chain still matches a fresh sequence's."""
    bm = BlockManager(32, BS, enable_prefix_caching=True, window=16)
    seq = make_seq(100)
    compute(bm, seq, 100)
    released = num_released(seq.block_table)
    assert released == (100 - 15) // 16
    bm.free(seq, keep_released=True)
    assert seq.block_table == [RELEASED] * released and bm.num_free_blocks == bm.num_blocks
    assert bm.num_new_blocks(seq, 101) == 7 - released
    bm.grow(seq, 101)
    bm.publish_full_blocks(seq)  # from block 0 again: RELEASED entries only move the chain
    assert seq.num_hashed_blocks == 6
    assert len(bm.match_prefix(make_seq(101, "again"))) == 6
    bm.release_out_of_window(seq)
    assert blocks_consistent(bm, [seq])


def test_swap_copies_only_the_window_and_back_to_the_same_indices() -> None:
    manager = SwapManager(num_host_blocks=4, block_size=BS, rule=SwapRule(min_tokens=1))
    seq = make_seq(100)
    seq.num_computed_tokens = 100
    seq.block_table = [RELEASED] * 5 + [11, 12]
    assert manager.swap_out(seq)
    assert manager.take_pending().swap_out == [(11, 0), (12, 1)]
    assert manager.num_free_blocks == 2
    seq.block_table = [RELEASED] * 5 + [3, 4]  # readmitted after its kept released entries
    manager.swap_in(seq)
    assert manager.take_pending().swap_in == [(0, 3), (1, 4)]
    assert manager.num_free_blocks == 4
    assert manager.swap_out(seq)
    seq.block_table = [3, 4]  # readmitted without the released entries: refused
    manager.swap_in(seq)
    with pytest.raises(RuntimeError):
        manager.take_pending()


def test_kv_tokens_count_only_the_held_blocks() -> None:
    bm = BlockManager(32, BS, window=16)
    parent = make_seq(70, "parent")
    compute(bm, parent, 50)  # (50 - 15) // 16 = 2 released: tokens 32..49 held
    child = make_seq(70, "child")
    bm.fork(parent, child)
    child.num_computed_tokens = 50
    assert distinct_kv_tokens([parent], bm) == 18
    assert distinct_kv_tokens([parent, child], bm) == 18  # the shared blocks count once


# -- end to end ------------------------------------------------------------------------
_ids = itertools.count()


@functools.cache
def _hf(model: str, prompt: tuple[int, ...], n: int) -> list[int]:
    return hf_greedy(model, list(prompt), n)


def _greedy(n: int = NEW_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def _run(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams | list[SamplingParams],
         *, late: tuple[int, list[int], int] | None = None) -> tuple[list, dict]:
    """Step ``engine`` over ``prompts`` to the end, checking after every step that the
    block manager is consistent and that no running sequence holds more than its window's
    blocks (ceil(W / bs) + 2); returns the outputs in order and the run's counts.
    ``late``: (step, prompt, priority) of one more request (greedy, NEW_TOKENS) added
    after that step, its output last."""
    bm, sched = engine.block_manager, engine.scheduler
    cap = -(-bm.window // bm.block_size) + 2
    params_list = params if isinstance(params, list) else [params] * len(prompts)
    ids = []
    for prompt, p in zip(prompts, params_list, strict=True):
        ids.append(f"w{next(_ids)}")
        engine.add_request(ids[-1], prompt, p)
    done: dict[str, object] = {}
    counts = {"preemptions": 0, "cached": 0, "peak_used": 0, "released": 0, "steps": 0}
    while engine.has_unfinished_requests():
        if late is not None and counts["steps"] == late[0]:
            ids.append(f"w{next(_ids)}")
            engine.add_request(ids[-1], late[1], _greedy(), priority=late[2])
        outputs, stats = engine.step()
        counts["steps"] += 1
        counts["preemptions"] += stats.num_preemptions
        counts["cached"] += stats.num_cached_tokens
        counts["peak_used"] = max(counts["peak_used"], bm.num_used_blocks)
        holders = [*sched.running, *sched.padding, *sched.waiting]
        assert blocks_consistent(bm, holders)
        for seq in sched.running:
            counts["released"] = max(counts["released"], num_released(seq.block_table))
            if bm.window:
                assert len(held(seq)) <= cap, (seq.num_computed_tokens, seq.block_table)
        for seq in sched.waiting:  # preempted: nothing held (a swapped one keeps -1s only)
            assert not held(seq)
        done.update({o.request_id: o for o in outputs if o.finished})
    assert bm.num_free_blocks == bm.num_blocks
    return [done[i] for i in ids], counts


def _check_hf(model: str, prompts: list[list[int]], outputs: list, n: int | list[int] = NEW_TOKENS) -> None:
    lengths = n if isinstance(n, list) else [n] * len(prompts)
    for prompt, out, k in zip(prompts, outputs, lengths, strict=True):
        assert out.token_ids == _hf(model, tuple(prompt), k), f"prompt of {len(prompt)} tokens"


BACKENDS = pytest.mark.parametrize("backend", ["torch", None], ids=["torch", "native"])


@BACKENDS
@pytest.mark.parametrize("policy", ["fcfs", "static-padded"])
def test_mistral_greedy_equals_hf_with_a_window_of_blocks(backend: str | None, policy: str) -> None:
    engine = LLMEngine(model="tiny-mistral", num_kv_blocks=64, max_num_seqs=8,
                       attention_backend=backend, policy=policy)
    assert engine.block_manager.window == 16
    prompts = prompt_token_lists(engine.tokenizer, 4, seed=11, lo=20, hi=55)
    lengths = [NEW_TOKENS - 10 * i for i in (3, 2, 1, 0)]  # static-padded: finished ones pad
    outputs, counts = _run(engine, prompts, [_greedy(n) for n in lengths])
    _check_hf("tiny-mistral", prompts, outputs, lengths)
    assert counts["released"] >= (55 + NEW_TOKENS - 16) // BS - 1  # released all along
    assert counts["peak_used"] <= 4 * 3  # ceil(16 / 16) + 2 blocks each after a step


@BACKENDS
def test_pool_too_small_without_release_runs_without_preemption(backend: str | None) -> None:
    pool = 16
    engine = LLMEngine(model="tiny-mistral", num_kv_blocks=pool, max_num_seqs=4,
                       attention_backend=backend, enable_prefix_caching=False)
    prompts = prompt_token_lists(engine.tokenizer, 4, seed=12, lo=40, hi=50)
    bm = engine.block_manager
    # held whole, the four sequences would need far more blocks than the pool has
    assert sum(bm.blocks_needed(len(p) + NEW_TOKENS) for p in prompts) > pool + 8
    outputs, counts = _run(engine, prompts, _greedy())
    _check_hf("tiny-mistral", prompts, outputs)
    assert counts["preemptions"] == 0
    # release off (the window still applies in the kernels): the same run must preempt
    engine.block_manager.window = 0
    again, counts_off = _run(engine, prompts, _greedy())
    assert counts_off["preemptions"] > 0
    assert [o.token_ids for o in again] == [o.token_ids for o in outputs]


def _spy_swaps(engine: LLMEngine) -> list[int]:
    """The released entries of each sequence the engine swaps out, as they are swapped."""
    assert engine.swapper is not None
    manager = engine.swapper.manager
    swap_out = manager.swap_out
    released: list[int] = []

    def spy(seq: Sequence) -> bool:
        released.append(num_released(seq.block_table))
        return swap_out(seq)

    manager.swap_out = spy  # type: ignore[method-assign]
    return released


@BACKENDS
@pytest.mark.parametrize("swap", [False, True], ids=["recompute", "swap"])
def test_preemption_in_a_crowded_pool(backend: str | None, swap: bool) -> None:
    """Short prompts admitted on a block or two each outgrow a tiny pool (blocks of 4
    tokens: a sequence holds 4-5 blocks of its window)."""
    engine = LLMEngine(model="tiny-mistral", num_kv_blocks=18, block_size=4, max_num_seqs=8,
                       attention_backend=backend, swap_space=(1 << 20) if swap else 0,
                       swap_min_tokens=1)
    swapped = _spy_swaps(engine) if swap else []
    prompts = prompt_token_lists(engine.tokenizer, 6, seed=13, lo=4, hi=12)
    outputs, counts = _run(engine, prompts, _greedy())
    _check_hf("tiny-mistral", prompts, outputs)
    assert counts["preemptions"] > 0 and counts["released"] > 0
    if swap:
        assert swapped and engine.swapper is not None
        assert engine.swapper.manager.total_swapped_out == counts["preemptions"]


@BACKENDS
@pytest.mark.parametrize("swap", [False, True], ids=["recompute", "swap"])
def test_preemption_after_blocks_were_released(backend: str | None, swap: bool) -> None:
    """A higher-priority request takes the slot of a sequence 40 steps into its
    generation, long past its window: it is swapped with released entries (or recomputed)
    and resumes with the right tokens."""
    engine = LLMEngine(model="tiny-mistral", num_kv_blocks=32, max_num_seqs=2, policy="priority",
                       attention_backend=backend, swap_space=(1 << 20) if swap else 0,
                       swap_min_tokens=1)
    swapped = _spy_swaps(engine) if swap else []
    prompts = prompt_token_lists(engine.tokenizer, 3, seed=19, lo=20, hi=40)
    outputs, counts = _run(engine, prompts[:2], _greedy(), late=(40, prompts[2], 1))
    _check_hf("tiny-mistral", prompts, outputs)
    assert counts["preemptions"] == 1
    if swap:
        assert len(swapped) == 1 and swapped[0] >= (20 + 40 - 15) // BS


@BACKENDS
def test_prefix_caching_with_repeated_prompts(backend: str | None) -> None:
    """Released published blocks stay findable. The pool is committed, so never-used
    blocks are handed out before cached ones (on a lazily committed CPU pool the running
    sequences reuse the released blocks first, their cache entries with them)."""
    engine = LLMEngine(model="tiny-mistral", num_kv_blocks=64, max_num_seqs=8, commit_kv_pool=True,
                       attention_backend=backend, enable_prefix_caching=True)
    prompts = prompt_token_lists(engine.tokenizer, 3, seed=14, lo=40, hi=60)
    first, counts = _run(engine, prompts, _greedy())
    assert counts["cached"] == 0 and counts["released"] > 0
    second, counts = _run(engine, [*prompts, prompts[0]], _greedy())
    # every full block of each prompt (never its last token) is found again
    assert counts["cached"] >= sum((len(p) - 1) // BS * BS for p in prompts)
    _check_hf("tiny-mistral", prompts, first)
    _check_hf("tiny-mistral", [*prompts, prompts[0]], second)


@BACKENDS
def test_chunked_prefill_of_prompts_longer_than_the_window(backend: str | None) -> None:
    engine = LLMEngine(model="tiny-mistral", num_kv_blocks=24, max_num_seqs=4,
                       attention_backend=backend, max_num_batched_tokens=8)
    prompts = prompt_token_lists(engine.tokenizer, 4, seed=15, lo=30, hi=55)
    outputs, counts = _run(engine, prompts, _greedy())
    _check_hf("tiny-mistral", prompts, outputs)
    assert counts["released"] > 0


def test_speculative_drafts_with_release() -> None:
    engine = LLMEngine(model="tiny-mistral", num_kv_blocks=32, max_num_seqs=4,
                       attention_backend="torch", num_speculative_tokens=4)
    prompts = prompt_token_lists(engine.tokenizer, 4, seed=16, lo=20, hi=50)
    outputs, counts = _run(engine, prompts, _greedy())
    _check_hf("tiny-mistral", prompts, outputs)
    assert counts["released"] > 0


def test_forked_samples_equal_a_run_without_release() -> None:
    engine = LLMEngine(model="tiny-mistral", num_kv_blocks=48, max_num_seqs=8,
                       attention_backend="torch", enable_prefix_caching=False)
    prompts = prompt_token_lists(engine.tokenizer, 2, seed=17, lo=40, hi=50)
    params = [SamplingParams(n=3, temperature=1.0, seed=5 + i, max_tokens=NEW_TOKENS, ignore_eos=True)
              for i in range(2)]
    with_release, counts = _run(engine, prompts, params)
    assert counts["released"] > 0
    engine.block_manager.window = 0
    without, _ = _run(engine, prompts, params)
    for a, b in zip(with_release, without, strict=True):
        assert [s.token_ids for s in a.samples] == [s.token_ids for s in b.samples]


@BACKENDS
def test_gemma2_mixed_windows_release_nothing(backend: str | None) -> None:
    engine = LLMEngine(model="tiny-gemma2", num_kv_blocks=64, max_num_seqs=8,
                       attention_backend=backend)
    assert engine.block_manager.window == 0  # a layer sees the whole context
    prompts = prompt_token_lists(engine.tokenizer, 3, seed=18, lo=25, hi=55)
    seen: list[int] = []
    release = engine.block_manager.release_out_of_window

    def spy(seq: Sequence) -> int:
        seen.append(release(seq))
        return seen[-1]

    engine.block_manager.release_out_of_window = spy  # type: ignore[method-assign]
    outputs, counts = _run(engine, prompts, _greedy())
    _check_hf("tiny-gemma2", prompts, outputs)
    assert counts["released"] == 0 and seen == []  # not even called without a window


def test_a_windowed_model_runs_requests_longer_than_the_pool() -> None:
    """With windows on every layer a sequence holds about window + one chunk of KV, so a
    request longer than the whole pool is admitted and still equals transformers."""
    from worker.engine import InvalidRequestError

    # 10 blocks of 16 = 160 tokens; window 16 + chunks of 32 + 2 partial blocks = 80.
    engine = LLMEngine(model="tiny-mistral", num_kv_blocks=10, max_num_batched_tokens=32)
    prompt = prompt_token_lists(engine.tokenizer, 1, seed=4, lo=60, hi=60)[0]
    engine.add_request("long", prompt, SamplingParams(temperature=0.0, max_tokens=150, ignore_eos=True))
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        tokens += [t for o in engine.step()[0] if o.finished for t in o.token_ids]
    assert len(prompt) + 150 > 160
    assert tokens == hf_greedy("tiny-mistral", prompt, 150)
    # Without windows the same request is refused at once, naming the pool.
    plain = LLMEngine(model="tiny-llama", num_kv_blocks=10, max_num_batched_tokens=32)
    with pytest.raises(InvalidRequestError, match="whole pool holds"):
        plain.add_request("long", prompt, SamplingParams(temperature=0.0, max_tokens=150, ignore_eos=True))
