"""The pure-torch paged kernels (kernels/reference.py) against naive dense attention.

The naive oracle here is written independently: per sequence, positions are turned into
slots one at a time, keys are expanded per query head, and attention is a float64 matmul,
an explicit causal mask and a softmax. Unused cache slots hold NaN, so reading one fails.
The paged-batch builder is shared with tests/test_kernels_triton.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import reference


@dataclass
class PagedBatch:
    """A paged KV cache holding the context of a few sequences, plus their full K/V."""

    k_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim], NaN where unused
    v_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim], NaN where unused
    block_tables: (
        torch.Tensor
    )  # [num_seqs, max_blocks_per_seq], past-the-end entries -> a NaN block
    context_lens: torch.Tensor  # [num_seqs]
    keys: list[torch.Tensor]  # per sequence [context_len, num_kv_heads, head_dim]
    values: list[torch.Tensor]  # per sequence [context_len, num_kv_heads, head_dim]
    slots: list[torch.Tensor]  # per sequence [context_len] int64 cache slot of each position


def make_paged_batch(
    context_lens: list[int],
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    index_dtype: torch.dtype = torch.int64,
) -> PagedBatch:
    """Scatter each sequence's random K/V over shuffled cache blocks.

    Blocks are assigned in a random order (so pages of one sequence are not adjacent), one
    spare block is never assigned and every table entry past a sequence's last block points
    to it; that block and the unused tail of each last block are NaN.
    """
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [math.ceil(n / block_size) for n in context_lens]
    num_blocks = sum(blocks_per_seq) + 2
    order = torch.randperm(num_blocks, generator=gen)
    spare = int(order[-1])
    max_blocks = max(blocks_per_seq) + 1  # always at least one past-the-end entry
    block_tables = torch.full((len(context_lens), max_blocks), spare, dtype=torch.int64)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)  # [num_blocks * block_size, Hkv, D]
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)  # [num_blocks * block_size, Hkv, D]
    keys, values, slots = [], [], []
    next_block = 0
    for i, (n, nb) in enumerate(zip(context_lens, blocks_per_seq, strict=True)):
        block_tables[i, :nb] = order[next_block : next_block + nb]
        next_block += nb
        pos = torch.arange(n)
        slot = block_tables[i, pos // block_size] * block_size + pos % block_size  # [n]
        k = torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype)
        k_flat[slot], v_flat[slot] = k, v
        keys.append(k)
        values.append(v)
        slots.append(slot)
    return PagedBatch(
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=block_tables.to(index_dtype),
        context_lens=torch.tensor(context_lens, dtype=index_dtype),
        keys=keys,
        values=values,
        slots=slots,
    )


def naive_attention(
    q: torch.Tensor,  # [q_len, num_heads, head_dim], the last q_len of the context
    k: torch.Tensor,  # [context_len, num_kv_heads, head_dim]
    v: torch.Tensor,  # [context_len, num_kv_heads, head_dim]
    scale: float,
) -> torch.Tensor:  # [q_len, num_heads, head_dim] float64
    """Dense causal attention of one sequence's trailing queries, in float64."""
    q_len, num_heads, _ = q.shape
    context_len, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    kv_of_head = torch.arange(num_heads) // group  # query head h reads KV head h // group
    k_h = k.double()[:, kv_of_head].transpose(0, 1)  # [H, K, D]
    v_h = v.double()[:, kv_of_head].transpose(0, 1)  # [H, K, D]
    scores = q.double().transpose(0, 1) @ k_h.transpose(1, 2) * scale  # [H, Q, K]
    q_pos = torch.arange(context_len - q_len, context_len)
    allowed = torch.arange(context_len)[None, :] <= q_pos[:, None]  # [Q, K]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v_h).transpose(0, 1)  # [Q, H, D]


def cu_seqlens(q_lens: list[int]) -> torch.Tensor:
    """``[0, q0, q0 + q1, ...]`` as int64."""
    return torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int64)


RAGGED = [1, 15, 16, 17, 32, 33, 70]  # 1, block boundaries +-1 for 16 and 32, several blocks


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("group", [1, 3, 4])
def test_decode_matches_naive(block_size: int, group: int) -> None:
    num_kv_heads, head_dim = 2, 32
    batch = make_paged_batch(RAGGED, block_size, num_kv_heads, head_dim, seed=group)
    query = torch.randn(len(RAGGED), num_kv_heads * group, head_dim)
    scale = head_dim**-0.5
    out = reference.decode_attention(
        query, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, scale
    )
    for i in range(len(RAGGED)):
        want = naive_attention(query[i : i + 1], batch.keys[i], batch.values[i], scale)
        torch.testing.assert_close(out[i : i + 1].double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("group", [1, 4])
def test_prefill_matches_naive_with_cached_prefix(block_size: int, group: int) -> None:
    # (context_len, q_len): whole prompts, chunks over a cached prefix, a 1-token chunk,
    # a chunk ending exactly on a block boundary, and an empty chunk.
    layout = [(1, 1), (16, 16), (33, 33), (40, 7), (64, 32), (33, 1), (20, 0)]
    contexts = [c for c, _ in layout]
    q_lens = [q for _, q in layout]
    num_kv_heads, head_dim = 2, 32
    batch = make_paged_batch(contexts, block_size, num_kv_heads, head_dim, seed=block_size)
    query = torch.randn(sum(q_lens), num_kv_heads * group, head_dim)
    cu = cu_seqlens(q_lens)
    scale = 0.3
    out = reference.prefill_attention(
        query, batch.k_cache, batch.v_cache, batch.block_tables, cu, batch.context_lens, scale
    )
    for i in range(len(layout)):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        want = naive_attention(query[rows], batch.keys[i], batch.values[i], scale)
        torch.testing.assert_close(out[rows].double(), want, atol=1e-5, rtol=1e-5)


def test_decode_equals_prefill_of_one_token() -> None:
    batch = make_paged_batch([5, 16, 49], 16, 1, 16, seed=3)
    query = torch.randn(3, 4, 16)
    args = (batch.k_cache, batch.v_cache, batch.block_tables)
    dec = reference.decode_attention(query, *args, batch.context_lens, 0.25)
    pre = reference.prefill_attention(query, *args, cu_seqlens([1, 1, 1]), batch.context_lens, 0.25)
    torch.testing.assert_close(dec, pre, atol=1e-6, rtol=1e-6)


def test_decode_bf16_stays_close_to_float64() -> None:
    batch = make_paged_batch(RAGGED, 16, 2, 64, dtype=torch.bfloat16, seed=7)
    query = torch.randn(len(RAGGED), 6, 64).to(torch.bfloat16)
    out = reference.decode_attention(
        query, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, 0.125
    )
    assert out.dtype == torch.bfloat16
    for i in range(len(RAGGED)):
        want = naive_attention(query[i : i + 1], batch.keys[i], batch.values[i], 0.125)
        # bf16 output rounding: 2**-8 relative, plus the absolute floor near zero.
        torch.testing.assert_close(out[i : i + 1].double(), want, atol=1e-2, rtol=1e-2)


def test_write_kv_stores_slots_and_skips_negative() -> None:
    num_blocks, block_size, num_kv_heads, head_dim = 4, 16, 2, 8
    k_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    slots = torch.tensor([0, -1, 15, 16, 63, -5, 40])
    key = torch.randn(len(slots), num_kv_heads, head_dim)
    value = torch.randn(len(slots), num_kv_heads, head_dim)
    reference.write_kv(key, value, k_cache, v_cache, slots)
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    written = set()
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            torch.testing.assert_close(k_flat[s], key[t], atol=0, rtol=0)
            torch.testing.assert_close(v_flat[s], value[t], atol=0, rtol=0)
            written.add(s)
    untouched = [s for s in range(num_blocks * block_size) if s not in written]
    assert torch.isnan(k_flat[untouched]).all() and torch.isnan(v_flat[untouched]).all()


def test_write_kv_casts_and_feeds_decode() -> None:
    """K/V written token by token (fp32 -> bf16 cache) are what decode then reads."""
    block_size, num_kv_heads, head_dim = 16, 1, 16
    context = 37
    k_cache = torch.full(
        (4, block_size, num_kv_heads, head_dim), float("nan"), dtype=torch.bfloat16
    )
    v_cache = torch.full_like(k_cache, float("nan"))
    table = torch.tensor([[2, 0, 3, 1]])
    pos = torch.arange(context)
    slots = table[0, pos // block_size] * block_size + pos % block_size
    key = torch.randn(context, num_kv_heads, head_dim)
    value = torch.randn(context, num_kv_heads, head_dim)
    reference.write_kv(key, value, k_cache, v_cache, slots)
    assert k_cache.dtype == torch.bfloat16
    query = torch.randn(1, 2, head_dim).to(torch.bfloat16)
    out = reference.decode_attention(query, k_cache, v_cache, table, torch.tensor([context]), 0.25)
    want = naive_attention(query, key.to(torch.bfloat16), value.to(torch.bfloat16), 0.25)
    torch.testing.assert_close(out.double(), want, atol=1e-2, rtol=1e-2)


@settings(max_examples=25, deadline=None)
@given(
    layout=st.lists(st.tuples(st.integers(1, 80), st.integers(0, 80)), min_size=1, max_size=4),
    block_size=st.sampled_from([16, 32]),
    group=st.sampled_from([1, 2, 3]),
)
def test_prefill_ragged_property(
    layout: list[tuple[int, int]], block_size: int, group: int
) -> None:
    contexts = [c for c, _ in layout]
    q_lens = [min(q, c) for c, q in layout]  # a chunk never exceeds its context
    batch = make_paged_batch(contexts, block_size, 1, 8, seed=sum(contexts))
    query = torch.randn(sum(q_lens), group, 8)
    cu = cu_seqlens(q_lens)
    out = reference.prefill_attention(
        query, batch.k_cache, batch.v_cache, batch.block_tables, cu, batch.context_lens, 0.5
    )
    for i in range(len(layout)):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        want = naive_attention(query[rows], batch.keys[i], batch.values[i], 0.5)
        torch.testing.assert_close(out[rows].double(), want, atol=1e-5, rtol=1e-5)
