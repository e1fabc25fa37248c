"""The pure-torch paged kernels (kernels/reference.py) against naive dense attention.

The naive oracle here is written independently: per sequence, positions are turned into
slots one at a time, keys are expanded per query head, and attention is a float64 matmul,
an optional soft-cap, an explicit mask (causal, and Hugging Face's sliding window
``kv_idx > q_idx - window`` when one is given) and a softmax. Unused cache slots hold NaN,
so reading one fails; with a window, the blocks wholly before it are NaN and their table
entries -1 (:func:`drop_blocks_before_window`), so reading one of those fails too.
The paged-batch builder lives in tests/kernels/paged_batch.py (shared with the Triton and native tests).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import reference
from tests.kernels.paged_batch import PagedBatch, cu_seqlens, make_paged_batch


def naive_attention(
    q: torch.Tensor,  # [q_len, num_heads, head_dim], the last q_len of the context
    k: torch.Tensor,  # [context_len, num_kv_heads, head_dim]
    v: torch.Tensor,  # [context_len, num_kv_heads, head_dim]
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:  # [q_len, num_heads, head_dim] float64
    """Dense causal attention of one sequence's trailing queries, in float64, over every
    key: with ``window > 0`` the query at position p sees keys p - window < k <= p, and
    with ``softcap > 0`` the scores are ``softcap * tanh(score / softcap)`` before masking."""
    q_len, num_heads, _ = q.shape
    context_len, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    kv_of_head = torch.arange(num_heads) // group  # query head h reads KV head h // group
    k_h = k.double()[:, kv_of_head].transpose(0, 1)  # [H, K, D]
    v_h = v.double()[:, kv_of_head].transpose(0, 1)  # [H, K, D]
    scores = q.double().transpose(0, 1) @ k_h.transpose(1, 2) * scale  # [H, Q, K]
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    q_pos = torch.arange(context_len - q_len, context_len)[:, None]  # [Q, 1]
    k_pos = torch.arange(context_len)[None, :]  # [1, K]
    allowed = k_pos <= q_pos  # [Q, K]
    if window > 0:
        allowed &= k_pos > q_pos - window  # transformers' sliding_window_overlay
    scores = scores.masked_fill(~allowed, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v_h).transpose(0, 1)  # [Q, H, D]


def drop_blocks_before_window(
    batch: PagedBatch, q_lens: list[int], window: int
) -> tuple[PagedBatch, int]:
    """A copy of ``batch`` as the engine leaves it once old blocks are freed: every block
    wholly before the window of a sequence's first query is NaN and its table entry -1.

    The caches sit one block into a NaN buffer, so a kernel that follows a -1 entry reads
    NaN there rather than outside the allocation. Returns the copy and how many blocks
    were dropped (so a test can check it dropped some); ``window == 0`` drops nothing.
    """
    if window == 0:
        return batch, 0
    block_size = batch.k_cache.shape[1]
    guard_k = torch.full((1, *batch.k_cache.shape[1:]), float("nan"), dtype=batch.k_cache.dtype)
    k_buf = torch.cat([guard_k, batch.k_cache])  # [1 + num_blocks, block_size, Hkv, D]
    v_buf = torch.cat([guard_k, batch.v_cache])  # [1 + num_blocks, block_size, Hkv, D]
    k_cache, v_cache = k_buf[1:], v_buf[1:]  # [num_blocks, block_size, Hkv, D] views
    tables = batch.block_tables.clone()  # [num_seqs, max_blocks]
    dropped = 0
    for i, (context_len, q_len) in enumerate(zip(batch.context_lens.tolist(), q_lens, strict=True)):
        if q_len == 0:
            continue
        first_needed = max(0, context_len - q_len - window + 1) // block_size
        for b in range(first_needed):
            block = int(tables[i, b])
            k_cache[block] = float("nan")
            v_cache[block] = float("nan")
            tables[i, b] = -1
            dropped += 1
    return replace(batch, k_cache=k_cache, v_cache=v_cache, block_tables=tables), dropped


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


# --- sliding window and soft-capping ----------------------------------------------------

WINDOWS = [0, 1, 7, 16, 33, 4096]  # off, smaller than / equal to a block, larger than any context
SOFTCAPS = [0.0, 50.0]
WINDOW_CONTEXTS = [1, 7, 15, 16, 17, 33, 70, 100]  # ragged, around block edges of 16 and 12
# (context_len, q_len): whole prompts, chunks over a prefix, 1-token and empty chunks, and
# a long chunk cut into several query tiles (reference.QUERY_TILE) that cross the window.
WINDOW_LAYOUT = [(1, 1), (16, 16), (33, 33), (40, 7), (70, 1), (20, 0), (600, 530)]


def scores_query(num_tokens: int, num_heads: int, head_dim: int, seed: int) -> torch.Tensor:
    """Queries large enough that scores reach tens (a soft-cap of 50 changes them)."""
    gen = torch.Generator().manual_seed(seed)
    return 3 * torch.randn(num_tokens, num_heads, head_dim, generator=gen)


@pytest.mark.parametrize("block_size", [16, 12])
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("softcap", SOFTCAPS)
@pytest.mark.parametrize(("num_kv_heads", "group"), [(2, 4), (1, 1)])
def test_decode_window_softcap_matches_dense(
    block_size: int, window: int, softcap: float, num_kv_heads: int, group: int
) -> None:
    head_dim = 32
    batch = make_paged_batch(WINDOW_CONTEXTS, block_size, num_kv_heads, head_dim, seed=window)
    query = scores_query(len(WINDOW_CONTEXTS), num_kv_heads * group, head_dim, seed=block_size)
    scale = head_dim**-0.5
    dropped, _ = drop_blocks_before_window(batch, [1] * len(WINDOW_CONTEXTS), window)
    out = reference.decode_attention(
        query, dropped.k_cache, dropped.v_cache, dropped.block_tables, dropped.context_lens,
        scale, window=window, softcap=softcap,
    )  # fmt: skip
    for i in range(len(WINDOW_CONTEXTS)):
        want = naive_attention(
            query[i : i + 1], batch.keys[i], batch.values[i], scale, window, softcap
        )
        torch.testing.assert_close(out[i : i + 1].double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block_size", [16, 12])
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("softcap", SOFTCAPS)
@pytest.mark.parametrize(("num_kv_heads", "group"), [(2, 4), (1, 1)])
def test_prefill_window_softcap_matches_dense(
    block_size: int, window: int, softcap: float, num_kv_heads: int, group: int
) -> None:
    contexts = [c for c, _ in WINDOW_LAYOUT]
    q_lens = [q for _, q in WINDOW_LAYOUT]
    head_dim = 32
    batch = make_paged_batch(contexts, block_size, num_kv_heads, head_dim, seed=window + 1)
    query = scores_query(sum(q_lens), num_kv_heads * group, head_dim, seed=block_size)
    cu = cu_seqlens(q_lens)
    scale = head_dim**-0.5
    dropped, _ = drop_blocks_before_window(batch, q_lens, window)
    out = reference.prefill_attention(
        query, dropped.k_cache, dropped.v_cache, dropped.block_tables, cu,
        dropped.context_lens, scale, window=window, softcap=softcap,
    )  # fmt: skip
    for i in range(len(WINDOW_LAYOUT)):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        want = naive_attention(query[rows], batch.keys[i], batch.values[i], scale, window, softcap)
        torch.testing.assert_close(out[rows].double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [1, 7, 33])
def test_blocks_before_the_window_are_not_read(window: int) -> None:
    """NaN blocks and -1 table entries before the window leave the result bit-identical."""
    batch = make_paged_batch(WINDOW_CONTEXTS, 12, 2, 32, seed=4)
    query = scores_query(len(WINDOW_CONTEXTS), 8, 32, seed=4)
    args = (batch.block_tables, batch.context_lens, 0.2)
    dropped, count = drop_blocks_before_window(batch, [1] * len(WINDOW_CONTEXTS), window)
    assert count > 0
    clean = reference.decode_attention(query, batch.k_cache, batch.v_cache, *args, window, 50.0)
    poisoned = reference.decode_attention(
        query, dropped.k_cache, dropped.v_cache, dropped.block_tables, dropped.context_lens,
        0.2, window, 50.0,
    )  # fmt: skip
    assert torch.equal(clean, poisoned)
    q_lens = [q for _, q in WINDOW_LAYOUT]
    contexts = [c for c, _ in WINDOW_LAYOUT]
    batch = make_paged_batch(contexts, 12, 2, 32, seed=5)
    query = scores_query(sum(q_lens), 8, 32, seed=5)
    cu = cu_seqlens(q_lens)
    dropped, count = drop_blocks_before_window(batch, q_lens, window)
    assert count > 0
    for softcap in SOFTCAPS:
        clean = reference.prefill_attention(
            query, batch.k_cache, batch.v_cache, batch.block_tables, cu, batch.context_lens,
            0.2, window, softcap,
        )  # fmt: skip
        poisoned = reference.prefill_attention(
            query, dropped.k_cache, dropped.v_cache, dropped.block_tables, cu,
            dropped.context_lens, 0.2, window, softcap,
        )  # fmt: skip
        assert torch.equal(clean, poisoned)


def test_defaults_are_no_window_and_no_softcap() -> None:
    batch = make_paged_batch([5, 40], 16, 1, 16, seed=2)
    query = torch.randn(2, 2, 16)
    args = (query, batch.k_cache, batch.v_cache, batch.block_tables)
    plain = reference.decode_attention(*args, batch.context_lens, 0.25)
    assert torch.equal(plain, reference.decode_attention(*args, batch.context_lens, 0.25, 0, 0.0))
    cu = cu_seqlens([1, 1])
    plain = reference.prefill_attention(*args, cu, batch.context_lens, 0.25)
    assert torch.equal(
        plain, reference.prefill_attention(*args, cu, batch.context_lens, 0.25, 0, 0.0)
    )


def test_negative_window_or_softcap_is_refused() -> None:
    batch = make_paged_batch([5], 16, 1, 16, seed=2)
    args = (torch.randn(1, 1, 16), batch.k_cache, batch.v_cache, batch.block_tables)
    with pytest.raises(ValueError, match="window must be >= 0"):
        reference.decode_attention(*args, batch.context_lens, 1.0, window=-1)
    with pytest.raises(ValueError, match="softcap must be >= 0"):
        reference.prefill_attention(*args, cu_seqlens([1]), batch.context_lens, 1.0, softcap=-2.0)
