"""Triton paged prefill attention: ragged query chunks over paged KV with a cached prefix.

Same contract as :func:`kernels.reference.prefill_attention`: sequence i's queries are the
last ``q_len`` of its ``context_lens[i]`` tokens; each sees the whole cached prefix and,
causally, the chunk up to itself. Flash-attention style: one program owns ``BLOCK_M``
query rows of one sequence for one query head and streams that sequence's keys in
``BLOCK_N`` tiles with an online softmax (fp32 statistics and accumulator). Keys every row
of the tile may see are processed without masks; only the tiles on the causal diagonal
are masked.

With a sliding window (``WINDOW = W > 0``, a compile-time constant; the query at position
p sees keys p - W < k <= p) a program starts at the key tile holding its first row's
window start: key tiles wholly before it, and their block-table entries, are never read.
The tiles on the window's lower edge (where some rows of the program see a key and others
do not) are masked like the diagonal; the tiles between see no mask. Soft-capping
(``SOFTCAP``, a compile-time flag) turns each score into
``softcap * tanh(scale * q.k / softcap)`` before the masks. With both off the kernel
compiles to exactly the code without them.

Query tiles are numbered without a device sync: sequence i's first tile is
``cu_seqlens_q[i] // BLOCK_M + i``, an upper-bound packing with
``num_tokens // BLOCK_M + num_seqs`` tiles in all; each program finds its sequence by
binary search over ``cu_seqlens_q`` and exits if its tile is past the sequence's end.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.reference import check_options
from kernels.triton_common import check_attention_args, check_index, check_out, dot_dtype, tanh

BLOCK_M = 64  # query rows per program
BLOCK_N = 64  # keys per inner iteration
LOG2E = 1.4426950408889634


@triton.jit
def _attend_tile(
    q,  # [BLOCK_M, BLOCK_D] query tile
    q_pos,  # [BLOCK_M] absolute position of each query row
    acc,  # [BLOCK_M, BLOCK_D] fp32 unnormalized output
    l_i,  # [BLOCK_M] fp32 softmax denominators
    m_i,  # [BLOCK_M] fp32 running max (log2 units)
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    table_row,  # pointer to this sequence's row of block_tables
    n0,  # first key position of the tile
    kv_start,  # keys at positions < kv_start are not read (MASKED and WINDOW only)
    kv_end,  # keys at positions >= kv_end are not read
    kv_head,
    scale_log2,
    softcap_scale,  # scale / softcap, SOFTCAP only
    softcap_log2,  # softcap * log2(e), SOFTCAP only
    stride_cb,
    stride_cs,
    stride_ch,
    head_dim,
    block_size,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    MASKED: tl.constexpr,  # apply the causal, window and end-of-context masks
    WINDOW: tl.constexpr,  # sliding window in keys (the query's own included); 0: none
    SOFTCAP: tl.constexpr,  # soft-cap the scores (softcap_scale, softcap_log2)
):
    """One online-softmax step of ``q`` against keys ``n0 .. n0 + BLOCK_N``.

    Masked, a row may see none of the tile's keys (a row whose window starts past them):
    its statistics then stay as they were (the exponentials are taken against 0, not -inf).
    """
    n = n0 + tl.arange(0, BLOCK_N)  # [BLOCK_N] key positions
    d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    if MASKED:
        valid = n < kv_end
        if WINDOW > 0:
            valid = valid & (n >= kv_start)
        block = tl.load(table_row + n // block_size, mask=valid, other=0).to(tl.int64)
        kv_mask = valid[:, None] & (d < head_dim)[None, :]  # [BLOCK_N, BLOCK_D]
    else:
        block = tl.load(table_row + n // block_size).to(tl.int64)
        kv_mask = (n >= 0)[:, None] & (d < head_dim)[None, :]  # [BLOCK_N, BLOCK_D]
    # 64-bit: block * stride_cb overflows int32 for caches over 2**31 elements.
    kv_off = block * stride_cb + (n % block_size) * stride_cs + kv_head * stride_ch  # [BLOCK_N]
    k = tl.load(k_cache_ptr + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0).to(DOT_DTYPE)
    if SOFTCAP:  # softcap * tanh(scale * q.k / softcap), in log2 units
        s = softcap_log2 * tanh(tl.dot(q, tl.trans(k), input_precision="ieee") * softcap_scale)
    else:
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale_log2  # [BLOCK_M, BLOCK_N]
    if MASKED:
        visible = (n[None, :] <= q_pos[:, None]) & valid[None, :]  # [BLOCK_M, BLOCK_N]
        if WINDOW > 0:
            visible = visible & (n[None, :] > q_pos[:, None] - WINDOW)
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))  # [BLOCK_M]
    # With a window a masked row may have seen nothing yet (-inf): exponentials against 0.
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new) if MASKED and WINDOW > 0 else m_new
    alpha = tl.exp2(m_i - m_ref)  # [BLOCK_M]
    p = tl.exp2(s - m_ref[:, None])  # [BLOCK_M, BLOCK_N]
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = tl.load(v_cache_ptr + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0).to(DOT_DTYPE)
    acc = acc * alpha[:, None] + tl.dot(
        p.to(v_cache_ptr.dtype.element_ty).to(DOT_DTYPE), v, input_precision="ieee"
    )
    return acc, l_i, m_new


@triton.jit
def _prefill_kernel(
    q_ptr,  # [num_tokens, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq]
    cu_seqlens_q_ptr,  # [num_seqs + 1]
    context_lens_ptr,  # [num_seqs]
    out_ptr,  # [num_tokens, num_heads, head_dim]
    scale_log2,  # softmax scale * log2(e)
    softcap_scale,  # scale / softcap, SOFTCAP only
    softcap_log2,  # softcap * log2(e), SOFTCAP only
    stride_qt,
    stride_qh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_bt,
    stride_ot,
    stride_oh,
    num_seqs,
    head_dim,
    block_size,
    group,  # query heads per KV head
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,  # next power of two >= head_dim
    DOT_DTYPE: tl.constexpr,  # tl.dot operand type, see kernels.triton_common.dot_dtype
    WINDOW: tl.constexpr,  # sliding window in keys (the query's own included); 0: none
    SOFTCAP: tl.constexpr,  # soft-cap the scores (softcap_scale, softcap_log2)
):
    tile = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // group

    # The sequence owning this tile: the last i with cu_seqlens_q[i] // BLOCK_M + i <= tile.
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_tile = tl.load(cu_seqlens_q_ptr + mid) // BLOCK_M + mid
        lo = tl.where(first_tile <= tile, mid + 1, lo)
        hi = tl.where(first_tile <= tile, hi, mid)
    seq = lo - 1
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    m0 = (tile - (q_start // BLOCK_M + seq)) * BLOCK_M  # first query row of the tile
    if m0 >= q_len:  # a spare tile of the upper-bound packing
        return
    context_len = tl.load(context_lens_ptr + seq)
    prefix = context_len - q_len  # absolute position of query row 0

    rows = m0 + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows within the chunk
    d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    row_mask = (rows < q_len)[:, None] & (d < head_dim)[None, :]  # [BLOCK_M, BLOCK_D]
    tokens = (q_start + rows).to(tl.int64)  # [BLOCK_M] packed token index
    q = tl.load(
        q_ptr + tokens[:, None] * stride_qt + head * stride_qh + d[None, :],
        mask=row_mask,
        other=0.0,
    ).to(DOT_DTYPE)  # [BLOCK_M, BLOCK_D]
    q_pos = prefix + rows  # [BLOCK_M]

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    table_row = block_tables_ptr + seq * stride_bt  # num_seqs * max_blocks fits int32
    # Keys up to prefix + m0 are causally visible to every row of the tile.
    full_end = ((prefix + m0 + 1) // BLOCK_N) * BLOCK_N
    if WINDOW > 0:
        # The first key any row sees (the first row's window start), and the first from which
        # every row (up to the tile's last real row) sees all keys: the tiles in between are
        # on the window's lower edge and masked; none before them is read.
        kv_start = tl.maximum(prefix + m0 - WINDOW + 1, 0)
        last_row = prefix + tl.minimum(m0 + BLOCK_M, q_len) - 1
        all_start = tl.maximum(last_row - WINDOW + 1, 0)
        win_lo = (kv_start // BLOCK_N) * BLOCK_N  # <= full_end
        free_start = tl.maximum(
            win_lo, tl.minimum(((all_start + BLOCK_N - 1) // BLOCK_N) * BLOCK_N, full_end)
        )
        for n0 in range(win_lo, free_start, BLOCK_N):
            acc, l_i, m_i = _attend_tile(
                q, q_pos, acc, l_i, m_i, k_cache_ptr, v_cache_ptr, table_row, n0, kv_start,
                full_end, kv_head, scale_log2, softcap_scale, softcap_log2, stride_cb,
                stride_cs, stride_ch, head_dim, block_size, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D,
                DOT_DTYPE=DOT_DTYPE, MASKED=True, WINDOW=WINDOW, SOFTCAP=SOFTCAP,
            )  # fmt: skip
    else:
        kv_start = 0
        free_start = 0
    # Keys free_start .. full_end are visible to every row of the tile: no masks.
    for n0 in range(free_start, full_end, BLOCK_N):
        acc, l_i, m_i = _attend_tile(
            q, q_pos, acc, l_i, m_i, k_cache_ptr, v_cache_ptr, table_row, n0, kv_start,
            full_end, kv_head, scale_log2, softcap_scale, softcap_log2, stride_cb, stride_cs,
            stride_ch, head_dim, block_size, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D,
            DOT_DTYPE=DOT_DTYPE, MASKED=False, WINDOW=WINDOW, SOFTCAP=SOFTCAP,
        )  # fmt: skip
    # The causal diagonal: keys up to the last row of the tile (from the window's first key
    # when that is past full_end).
    kv_end = tl.minimum(context_len, prefix + m0 + BLOCK_M)
    for n0 in range(full_end, kv_end, BLOCK_N):
        acc, l_i, m_i = _attend_tile(
            q, q_pos, acc, l_i, m_i, k_cache_ptr, v_cache_ptr, table_row, n0, kv_start,
            kv_end, kv_head, scale_log2, softcap_scale, softcap_log2, stride_cb, stride_cs,
            stride_ch, head_dim, block_size, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D,
            DOT_DTYPE=DOT_DTYPE, MASKED=True, WINDOW=WINDOW, SOFTCAP=SOFTCAP,
        )  # fmt: skip

    out = acc / l_i[:, None]
    out_off = tokens[:, None] * stride_ot + head * stride_oh + d[None, :]
    tl.store(out_ptr + out_off, out.to(out_ptr.dtype.element_ty), mask=row_mask)


def prefill_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq]
    cu_seqlens_q: torch.Tensor,  # [num_seqs + 1]
    context_lens: torch.Tensor,  # [num_seqs], cached prefix + this chunk
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
    *,
    out: torch.Tensor | None = None,  # [num_tokens, num_heads, head_dim]
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Ragged query chunks, each causal within itself and full over its cached prefix; with
    ``window > 0`` each query sees only its last ``window`` keys (blocks wholly before the
    window of a program's first row are not read), with ``softcap > 0`` the scores are
    soft-capped.

    Softmax statistics and the accumulator are fp32. ``out`` receives the result when
    given. Rows past ``cu_seqlens_q[-1]`` are not written; chunk lengths must not exceed
    their context lengths (not checked: that would need a device sync).
    """
    check_options(window, softcap)
    check_attention_args(query, k_cache, v_cache, block_tables, context_lens)
    num_seqs = block_tables.shape[0]
    check_index("cu_seqlens_q", cu_seqlens_q, (num_seqs + 1,))
    if cu_seqlens_q.device != query.device:
        raise ValueError(f"cu_seqlens_q is on {cu_seqlens_q.device}, query on {query.device}")
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    out = check_out(out, query)
    if num_tokens == 0 or num_seqs == 0:
        return out
    grid = (num_tokens // BLOCK_M + num_seqs, num_heads)
    _prefill_kernel[grid](
        q_ptr=query,
        k_cache_ptr=k_cache,
        v_cache_ptr=v_cache,
        block_tables_ptr=block_tables,
        cu_seqlens_q_ptr=cu_seqlens_q.contiguous(),
        context_lens_ptr=context_lens.contiguous(),
        out_ptr=out,
        scale_log2=scale * LOG2E,
        softcap_scale=scale / softcap if softcap > 0 else 0.0,
        softcap_log2=softcap * LOG2E,
        stride_qt=query.stride(0),
        stride_qh=query.stride(1),
        stride_cb=k_cache.stride(0),
        stride_cs=k_cache.stride(1),
        stride_ch=k_cache.stride(2),
        stride_bt=block_tables.stride(0),
        stride_ot=out.stride(0),
        stride_oh=out.stride(1),
        num_seqs=num_seqs,
        head_dim=head_dim,
        block_size=k_cache.shape[1],
        group=num_heads // num_kv_heads,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_D=triton.next_power_of_2(head_dim),
        DOT_DTYPE=dot_dtype(query.dtype),
        WINDOW=window,
        SOFTCAP=softcap > 0,
    )
    return out
