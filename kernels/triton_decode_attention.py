"""Triton paged decode attention: one query token per sequence over its whole paged context.

Same contract as :func:`kernels.reference.decode_attention`. One program handles one
(sequence, KV head, context partition): the ``group`` query heads sharing that KV head are
processed together (GQA), so each K/V tile is read once for all of them. Long contexts are
split into partitions handled by separate programs (flash-decoding / split-K), so a small
batch still fills the GPU; a second kernel (:func:`_decode_reduce_kernel`, the reduce step
of this one) merges the partial softmax results. When one partition covers every context,
the first kernel writes the output directly and no reduce is launched.

The number of partitions is derived from ``block_tables.shape[1] * block_size`` (an upper
bound on every context length), so the wrapper never syncs with the device.

With a sliding window (``WINDOW = W > 0``, a compile-time constant) a sequence's keys are
its last ``min(W, context_len)``: partitions are counted from the window's first key
instead of from key 0, so the block walk starts inside the window, blocks before it (and
their table entries) are never read, and the number of partitions (programs) follows
``min(W, max context)``. Soft-capping (``SOFTCAP``, a compile-time flag) turns each score
into ``softcap * tanh(scale * q.k / softcap)`` before the softmax. With both off the
kernels compile to exactly the code without them.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from kernels.reference import check_options
from kernels.triton_common import check_attention_args, check_out, dot_dtype, tanh

BLOCK_N = 64  # context tokens per inner iteration (spans several pages when pages are small)
MIN_PARTITION = 256  # fewest context tokens one program handles when splitting
MAX_SPLITS = 64  # most partitions per sequence (the reduce holds them all in one tile)
LOG2E = 1.4426950408889634


@triton.jit
def _decode_kernel(
    q_ptr,  # [num_seqs, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq]
    context_lens_ptr,  # [num_seqs]
    out_ptr,  # [num_seqs, num_heads, head_dim], written when SPLIT is false
    part_acc_ptr,  # [num_seqs, num_heads, num_splits, head_dim] fp32, unnormalized, SPLIT only
    part_max_ptr,  # [num_seqs, num_heads, num_splits] fp32, running max (log2 units), SPLIT only
    part_sum_ptr,  # [num_seqs, num_heads, num_splits] fp32, softmax denominators, SPLIT only
    scale_log2,  # softmax scale * log2(e)
    softcap_scale,  # scale / softcap, SOFTCAP only
    softcap_log2,  # softcap * log2(e), SOFTCAP only
    stride_qs,
    stride_qh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_bt,
    stride_os,
    stride_oh,
    num_heads,
    head_dim,
    block_size,
    group,  # query heads per KV head
    num_splits,
    partition_size,  # context tokens per split (a multiple of BLOCK_N), counted from the window
    GROUP_PAD: tl.constexpr,  # max(16, next power of two >= group): tl.dot needs M >= 16
    BLOCK_D: tl.constexpr,  # next power of two >= head_dim
    DOT_DTYPE: tl.constexpr,  # tl.dot operand type, see kernels.triton_common.dot_dtype
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    WINDOW: tl.constexpr,  # sliding window in keys (the query's own included); 0: none
    SOFTCAP: tl.constexpr,  # soft-cap the scores (softcap_scale, softcap_log2)
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq)
    if WINDOW > 0:
        start = tl.maximum(context_len - WINDOW, 0) + split * partition_size  # window's first key
    else:
        start = split * partition_size
    if start >= context_len:  # this partition is past the end of this sequence
        return
    end = tl.minimum(start + partition_size, context_len)

    g = tl.arange(0, GROUP_PAD)  # [GROUP_PAD]
    d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    heads = kv_head * group + g  # [GROUP_PAD] query heads of this KV head
    d_mask = d < head_dim
    q_mask = (g < group)[:, None] & d_mask[None, :]  # [GROUP_PAD, BLOCK_D]
    q = tl.load(
        q_ptr + seq * stride_qs + heads[:, None] * stride_qh + d[None, :], mask=q_mask, other=0.0
    ).to(DOT_DTYPE)  # [GROUP_PAD, BLOCK_D]

    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, BLOCK_D], dtype=tl.float32)
    table_row = block_tables_ptr + seq * stride_bt
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)  # [BLOCK_N] context positions
        valid = n < end
        block = tl.load(table_row + n // block_size, mask=valid, other=0).to(tl.int64)
        # 64-bit: block * stride_cb overflows int32 for caches over 2**31 elements.
        kv_off = block * stride_cb + (n % block_size) * stride_cs + kv_head * stride_ch  # [BLOCK_N]
        kv_mask = valid[:, None] & d_mask[None, :]  # [BLOCK_N, BLOCK_D]
        k = tl.load(k_cache_ptr + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0).to(
            DOT_DTYPE
        )
        if SOFTCAP:  # softcap * tanh(scale * q.k / softcap), in log2 units
            s = softcap_log2 * tanh(tl.dot(q, tl.trans(k), input_precision="ieee") * softcap_scale)
        else:
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale_log2  # [GROUP_PAD, BLOCK_N]
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # [GROUP_PAD], finite: start < end
        alpha = tl.exp2(m_i - m_new)  # [GROUP_PAD]
        p = tl.exp2(s - m_new[:, None])  # [GROUP_PAD, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0).to(
            DOT_DTYPE
        )
        acc = acc * alpha[:, None] + tl.dot(
            p.to(v_cache_ptr.dtype.element_ty).to(DOT_DTYPE), v, input_precision="ieee"
        )
        m_i = m_new

    if SPLIT:
        row = (seq * num_heads + heads) * num_splits + split  # [GROUP_PAD] partial row index
        tl.store(part_acc_ptr + row[:, None] * head_dim + d[None, :], acc, mask=q_mask)
        tl.store(part_max_ptr + row, m_i, mask=g < group)
        tl.store(part_sum_ptr + row, l_i, mask=g < group)
    else:
        out = acc / l_i[:, None]
        out_off = seq * stride_os + heads[:, None] * stride_oh + d[None, :]
        tl.store(out_ptr + out_off, out.to(out_ptr.dtype.element_ty), mask=q_mask)


@triton.jit
def _decode_reduce_kernel(
    part_acc_ptr,  # [num_seqs, num_heads, num_splits, head_dim] fp32
    part_max_ptr,  # [num_seqs, num_heads, num_splits] fp32
    part_sum_ptr,  # [num_seqs, num_heads, num_splits] fp32
    context_lens_ptr,  # [num_seqs]
    out_ptr,  # [num_seqs, num_heads, head_dim]
    stride_os,
    stride_oh,
    num_heads,
    head_dim,
    num_splits,
    partition_size,
    SPLITS_PAD: tl.constexpr,  # next power of two >= num_splits
    BLOCK_D: tl.constexpr,
    WINDOW: tl.constexpr,  # as the first kernel's: splits are counted from the window's start
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    context_len = tl.load(context_lens_ptr + seq)
    keys = tl.minimum(context_len, WINDOW) if WINDOW > 0 else context_len  # keys in the window
    num_valid = (keys + partition_size - 1) // partition_size  # splits the first kernel wrote
    sp = tl.arange(0, SPLITS_PAD)  # [SPLITS_PAD]
    d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    s_mask = sp < num_valid
    row = (seq * num_heads + head) * num_splits + sp  # [SPLITS_PAD]
    m = tl.load(part_max_ptr + row, mask=s_mask, other=float("-inf"))
    denom = tl.load(part_sum_ptr + row, mask=s_mask, other=0.0)
    weight = tl.where(s_mask, tl.exp2(m - tl.max(m, axis=0)), 0.0)  # [SPLITS_PAD]
    acc_mask = s_mask[:, None] & (d < head_dim)[None, :]  # [SPLITS_PAD, BLOCK_D]
    acc = tl.load(part_acc_ptr + row[:, None] * head_dim + d[None, :], mask=acc_mask, other=0.0)
    total = tl.sum(denom * weight, axis=0)
    out = tl.sum(acc * weight[:, None], axis=0) / total  # [BLOCK_D]
    tl.store(
        out_ptr + seq * stride_os + head * stride_oh + d,
        out.to(out_ptr.dtype.element_ty),
        mask=d < head_dim,
    )


@functools.lru_cache(maxsize=8)
def _target_programs(device: torch.device) -> int:
    """Programs that keep the device busy: two per SM on CUDA, a fixed 128 elsewhere."""
    if device.type == "cuda":
        return 2 * torch.cuda.get_device_properties(device).multi_processor_count
    return 128


def choose_partition_size(
    num_seqs: int, num_kv_heads: int, max_context: int, device: torch.device
) -> int:
    """Context tokens per program: split long contexts until the batch fills the device.

    A power of two, at least :data:`MIN_PARTITION`, and large enough that a sequence has at
    most :data:`MAX_SPLITS` partitions. Returns ``>= max_context`` when no split is needed.
    """
    work = num_seqs * num_kv_heads * max_context / _target_programs(device)
    size = max(MIN_PARTITION, triton.next_power_of_2(max(1, math.ceil(work))))
    return max(size, triton.next_power_of_2(triton.cdiv(max_context, MAX_SPLITS)))


def decode_attention(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq]
    context_lens: torch.Tensor,  # [num_seqs], >= 1, includes the query token itself
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
    *,
    partition_size: int | None = None,
    out: torch.Tensor | None = None,  # [num_seqs, num_heads, head_dim]
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """One query per sequence attending to its paged context (softmax in fp32): all of it,
    or with ``window > 0`` its last ``window`` keys (earlier blocks are not read); with
    ``softcap > 0`` the scores are soft-capped first.

    ``partition_size`` (a multiple of 64) forces the split-K partition length; by default
    :func:`choose_partition_size` picks it for the keys a sequence may have (the window
    when it is shorter than the block table). ``out`` receives the result when given.
    Context lengths must be in ``1..max_blocks_per_seq * block_size`` (not checked: that
    would need a device sync).
    """
    check_options(window, softcap)
    check_attention_args(query, k_cache, v_cache, block_tables, context_lens)
    num_seqs, num_heads, head_dim = query.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = check_out(out, query)
    if num_seqs == 0:
        return out
    context_lens = context_lens.contiguous()
    max_context = max(1, block_tables.shape[1] * block_size)
    if window > 0:
        max_context = min(max_context, window)  # keys one query may see
    if partition_size is None:
        partition_size = choose_partition_size(num_seqs, num_kv_heads, max_context, query.device)
    elif partition_size <= 0 or partition_size % BLOCK_N:
        raise ValueError(f"partition_size must be a positive multiple of {BLOCK_N}")
    num_splits = triton.cdiv(max_context, partition_size)
    split = num_splits > 1
    block_d = triton.next_power_of_2(head_dim)
    part_shape = (num_seqs, num_heads, num_splits) if split else (1, 1, 1)
    part_acc = torch.empty((*part_shape, head_dim), dtype=torch.float32, device=query.device)
    part_max = torch.empty(part_shape, dtype=torch.float32, device=query.device)
    part_sum = torch.empty(part_shape, dtype=torch.float32, device=query.device)
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        q_ptr=query,
        k_cache_ptr=k_cache,
        v_cache_ptr=v_cache,
        block_tables_ptr=block_tables,
        context_lens_ptr=context_lens,
        out_ptr=out,
        part_acc_ptr=part_acc,
        part_max_ptr=part_max,
        part_sum_ptr=part_sum,
        scale_log2=scale * LOG2E,
        softcap_scale=scale / softcap if softcap > 0 else 0.0,
        softcap_log2=softcap * LOG2E,
        stride_qs=query.stride(0),
        stride_qh=query.stride(1),
        stride_cb=k_cache.stride(0),
        stride_cs=k_cache.stride(1),
        stride_ch=k_cache.stride(2),
        stride_bt=block_tables.stride(0),
        stride_os=out.stride(0),
        stride_oh=out.stride(1),
        num_heads=num_heads,
        head_dim=head_dim,
        block_size=block_size,
        group=group,
        num_splits=num_splits,
        partition_size=partition_size,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        BLOCK_D=block_d,
        DOT_DTYPE=dot_dtype(query.dtype),
        BLOCK_N=BLOCK_N,
        SPLIT=split,
        WINDOW=window,
        SOFTCAP=softcap > 0,
    )
    if split:
        _decode_reduce_kernel[(num_seqs, num_heads)](
            part_acc_ptr=part_acc,
            part_max_ptr=part_max,
            part_sum_ptr=part_sum,
            context_lens_ptr=context_lens,
            out_ptr=out,
            stride_os=out.stride(0),
            stride_oh=out.stride(1),
            num_heads=num_heads,
            head_dim=head_dim,
            num_splits=num_splits,
            partition_size=partition_size,
            SPLITS_PAD=triton.next_power_of_2(num_splits),
            BLOCK_D=block_d,
            WINDOW=window,
        )
    return out
