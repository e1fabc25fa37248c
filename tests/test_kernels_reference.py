"""The pure-torch paged kernels (kernels/reference.py) against naive dense attention.

The naive oracle here is written independently: per sequence, positions are turned into
slots one at a time, keys are expanded per query head, and attention is a float64 matmul,
an explicit causal mask and a softmax. Unused cache slots hold NaN, so reading one fails.
The paged-batch builder lives in tests/paged_batch.py (shared with the Triton and native tests).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import reference
from tests.paged_batch import cu_seqlens, make_paged_batch


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
