"""Swap preemption on the CPU: a host pool stands in for device memory.

The engine with swapping must give the same greedy tokens as one that never preempts,
and a swapped sequence must not prefill again (fewer prefill tokens than recompute).
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import prompt_token_lists
from worker.engine import InvalidRequestError, LLMEngine, SamplingParams
from worker.engine.sequence import Sequence
from worker.engine.swap import HostKVPool, PendingCopies, SwapManager, SwapRule


def _seq(name: str, computed: int, blocks: list[int]) -> Sequence:
    seq = Sequence.__new__(Sequence)  # only the fields the manager reads
    seq.request_id, seq.num_computed_tokens, seq.block_table = name, computed, blocks
    return seq


def test_rule_swaps_long_contexts_and_recomputes_short_ones() -> None:
    manager = SwapManager(num_host_blocks=4, block_size=16, rule=SwapRule(min_tokens=20))
    assert not manager.swap_out(_seq("short", 19, [7, 8]))
    long = _seq("long", 33, [5, 6, 9, 3])
    assert manager.swap_out(long) and manager.is_swapped(long)
    assert manager.num_free_blocks == 1  # 33 tokens: 3 blocks, the 4th held nothing yet
    assert not manager.swap_out(_seq("too big", 40, [1, 2, 4]))  # host pool full
    assert (manager.total_swapped_out, manager.total_recomputed) == (1, 2)
    pending = manager.take_pending()
    assert pending.swap_out == [(5, 0), (6, 1), (9, 2)] and pending.swap_in == []


def test_swap_in_frees_host_blocks_only_after_its_copy() -> None:
    manager = SwapManager(num_host_blocks=3, block_size=16, rule=SwapRule(min_tokens=1))
    first = _seq("first", 40, [0, 1, 2])
    assert manager.swap_out(first)
    manager.take_pending()
    first.block_table = [7, 8, 9]  # readmitted into other device blocks
    manager.swap_in(first)
    assert not manager.swap_out(_seq("other", 16, [4]))  # first's host blocks still busy
    pending = manager.take_pending()
    assert pending.swap_in == [(0, 7), (1, 8), (2, 9)]
    assert manager.num_free_blocks == 3 and not manager.is_swapped(first)


def test_preempted_again_in_the_step_it_came_back_stays_on_the_host() -> None:
    manager = SwapManager(num_host_blocks=2, block_size=16, rule=SwapRule(min_tokens=1))
    seq = _seq("s", 20, [3, 4])
    manager.swap_out(seq)
    manager.take_pending()
    seq.block_table = [6, 7]
    manager.swap_in(seq)
    assert manager.swap_out(seq)  # same step: its host copy is still the valid one
    assert manager.take_pending() == PendingCopies()
    manager.discard(seq)
    assert manager.num_free_blocks == 2


def test_host_pool_copies_out_before_in() -> None:
    """Device block 1 is swapped out and refilled by a swap-in in the same step."""
    k_pool = torch.randn(2, 4, 16, 2, 8)  # [layers, blocks, block_size, Hkv, D]
    v_pool = torch.randn(2, 4, 16, 2, 8)
    k_before, v_before = k_pool.clone(), v_pool.clone()
    pool = HostKVPool(k_pool, v_pool, num_host_blocks=3)
    pool.apply(PendingCopies(swap_out=[(1, 2), (3, 0)]))
    pool.apply(PendingCopies(swap_out=[(0, 1)], swap_in=[(2, 0), (0, 1)]))
    assert torch.equal(k_pool[:, 0], k_before[:, 1]) and torch.equal(v_pool[:, 0], v_before[:, 1])
    assert torch.equal(k_pool[:, 1], k_before[:, 3]) and torch.equal(v_pool[:, 1], v_before[:, 3])
    assert torch.equal(pool.k_host[:, 1], k_before[:, 0])
    assert HostKVPool.bytes_per_block(k_pool) == 2 * 2 * 16 * 2 * 8 * 4


def _run(engine: LLMEngine, prompts: list[list[int]], max_tokens: list[int]
         ) -> tuple[list[list[int]], int, int]:
    """Outputs in order, preemptions and prefill tokens of a whole run."""
    for i, (p, n) in enumerate(zip(prompts, max_tokens, strict=True)):
        engine.add_request(f"r{i}", p, SamplingParams(temperature=0.0, max_tokens=n,
                                                       ignore_eos=True))
    done, preemptions, prefill = {}, 0, 0
    while engine.has_unfinished_requests():
        outputs, stats = engine.step()
        preemptions += stats.num_preemptions
        prefill += stats.num_prefill_tokens
        done.update({o.request_id: list(o.token_ids) for o in outputs if o.finished})
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return [done[f"r{i}"] for i in range(len(prompts))], preemptions, prefill


@pytest.fixture(scope="module")
def workload() -> tuple[list[list[int]], list[int], list[list[int]], int]:
    """Prompts of 10-50 tokens, their tokens from an engine that never preempts, and the
    prefill tokens that engine computed."""
    roomy = LLMEngine(model="tiny-llama", num_kv_blocks=256, max_num_seqs=16)
    prompts = prompt_token_lists(roomy.tokenizer, 10, seed=6, lo=10, hi=50)
    max_tokens = [12 + 3 * i for i in range(len(prompts))]
    expected, preemptions, prefill = _run(roomy, prompts, max_tokens)
    assert preemptions == 0
    return prompts, max_tokens, expected, prefill


def _tight_run(workload, min_tokens: int) -> tuple[list[list[int]], int, int, SwapManager]:
    """The workload on a 12-block pool with 1 MiB of host swap space."""
    prompts, max_tokens, _, _ = workload
    engine = LLMEngine(model="tiny-llama", num_kv_blocks=12, max_num_seqs=16,
                       swap_space=1 << 20, swap_min_tokens=min_tokens)
    assert engine.swapper is not None
    return (*_run(engine, prompts, max_tokens), engine.swapper.manager)


def test_swapping_loses_nothing_and_computes_no_prompt_twice(workload) -> None:
    expected, prefill = workload[2], workload[3]
    outputs, preemptions, swapped_prefill, manager = _tight_run(workload, min_tokens=1)
    assert preemptions > 0 and manager.total_swapped_out == preemptions
    assert outputs == expected
    # a swapped-in sequence resumes where it stopped: its prompt runs once, like without
    # preemption (one-token resumptions count as decode tokens)
    assert swapped_prefill == prefill
    assert manager.num_free_blocks == manager.num_blocks


def test_short_contexts_recompute_long_ones_swap(workload) -> None:
    outputs, preemptions, _, manager = _tight_run(workload, min_tokens=40)
    assert manager.total_swapped_out > 0 and manager.total_recomputed > 0
    assert manager.total_swapped_out + manager.total_recomputed == preemptions
    assert outputs == workload[2]


def test_swap_space_smaller_than_a_block_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="smaller than one KV block"):
        LLMEngine(model="tiny-llama", num_kv_blocks=16, swap_space=100)
    with pytest.raises(InvalidRequestError, match="swap_space must be"):
        LLMEngine(model="tiny-llama", num_kv_blocks=16, swap_space=-1)
