"""Pure-torch paged-attention kernels: the implementation off CUDA and the oracle in tests.

Layouts (shared with the Triton kernels):
- KV cache of one layer: ``[num_blocks, block_size, num_kv_heads, head_dim]`` for K and V.
- ``block_tables``: ``[num_seqs, max_blocks_per_seq]`` int32/int64; entries past a
  sequence's last block are never read.
- Queries are packed: ``[num_tokens, num_heads, head_dim]``, sequence i owning rows
  ``cu_seqlens_q[i]:cu_seqlens_q[i+1]``; those queries are the *last* q_len tokens of its
  ``context_lens[i]`` tokens, whose K/V are already in the cache.

Two per-layer options shape the scores (both off by default, and then nothing extra runs):
- ``window = W > 0``: sliding-window attention, as Hugging Face's
  ``masking_utils.sliding_window_overlay`` (``kv_idx > q_idx - W``) on top of the causal
  mask: the query at absolute position p sees keys p - W < k <= p, W keys with itself.
  Blocks wholly before the window of every query of a sequence are never read, nor are
  their block-table entries (the engine may have freed them and put -1 there); the first
  block read is ``max(0, first_query_pos - W + 1) // block_size``.
- ``softcap = c > 0``: attention-logit soft-capping (Gemma 2's ``attn_logit_softcapping``):
  scores become ``c * tanh(scale * q.k / c)``, after scaling and before masking/softmax.

No function computes anything for a padding token: work is proportional to the real
query-key pairs (within the window when there is one).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def write_kv(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens], slot = block * block_size + offset; < 0 skipped
) -> None:
    """Store each token's K and V at its slot; tokens with a negative slot are skipped."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)  # [num_blocks * block_size, Hkv, D]
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)  # [num_blocks * block_size, Hkv, D]
    slots = slot_mapping.long()
    keep = slots >= 0
    if not bool(keep.all()):
        slots, key, value = slots[keep], key[keep], value[keep]
    k_flat.index_copy_(0, slots, key.to(k_cache.dtype))
    v_flat.index_copy_(0, slots, value.to(v_cache.dtype))


def check_options(window: int, softcap: float) -> None:
    """Refuse a negative window or soft-cap (0 turns either off); shared by every backend."""
    if window < 0:
        raise ValueError(f"window must be >= 0 (0: no sliding window), got {window}")
    if not softcap >= 0.0:  # also refuses NaN
        raise ValueError(f"softcap must be >= 0 (0: no soft-capping), got {softcap}")


def soft_cap(scores: torch.Tensor, softcap: float) -> torch.Tensor:
    """``softcap * tanh(scores / softcap)`` (scores already scaled), in place; 0: unchanged.

    The order of Hugging Face's Gemma 2 eager attention: divide, tanh, multiply.
    """
    if softcap > 0.0:
        scores.div_(softcap).tanh_().mul_(softcap)
    return scores


def decode_attention(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq]
    context_lens: torch.Tensor,  # [num_seqs], >= 1, includes the query token itself
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """One query per sequence attending to its context (the last ``window`` keys when
    ``window > 0``), vectorized across sequences; ``softcap > 0`` soft-caps the scores.

    Work is organised per (sequence, block) pair: every block a sequence uses is gathered
    once, scores are one batched matmul per KV head over all pairs, and the softmax is a
    segment softmax over each sequence's pairs. Nothing is padded to the longest context;
    only the unused tail slots of each sequence's last block, and with a window the slots
    of its first block that lie before the window, are masked. Blocks wholly before the
    window are not pairs at all: neither they nor their block-table entries are read.
    """
    check_options(window, softcap)
    num_seqs, num_heads, head_dim = query.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    device = query.device
    lens = context_lens.long()
    end_blocks = torch.div(lens + block_size - 1, block_size, rounding_mode="floor")  # [S]
    if window > 0:
        # the query at lens - 1 sees keys lens - window .. lens - 1
        window_start = (lens - window).clamp(min=0)  # [S] first key position seen
        first_block = torch.div(window_start, block_size, rounding_mode="floor")  # [S]
    else:
        window_start = first_block = torch.zeros_like(lens)  # [S]
    num_blocks = end_blocks - first_block  # [S] blocks read per sequence
    seq_of_pair = torch.repeat_interleave(torch.arange(num_seqs, device=device), num_blocks)  # [P]
    first_pair = torch.cumsum(num_blocks, 0) - num_blocks  # [S]
    pair = torch.arange(seq_of_pair.numel(), device=device)  # [P]
    block_index = pair - first_pair[seq_of_pair] + first_block[seq_of_pair]  # [P] table column
    block_ids = block_tables.long()[seq_of_pair, block_index]  # [P]
    keys = torch.index_select(k_cache, 0, block_ids).float()  # [P, block_size, Hkv, D]
    values = torch.index_select(v_cache, 0, block_ids).float()  # [P, block_size, Hkv, D]
    q = query.float().view(num_seqs, num_kv_heads, group, head_dim)  # [S, Hkv, G, D]
    q_pairs = torch.index_select(q, 0, seq_of_pair)  # [P, Hkv, G, D]
    positions = block_index.unsqueeze(1) * block_size + torch.arange(block_size, device=device)  # [P, bs]
    unused = positions >= lens[seq_of_pair].unsqueeze(1)  # [P, bs]
    if window > 0:
        unused |= positions < window_start[seq_of_pair].unsqueeze(1)  # before the window
    unused = unused.unsqueeze(1)  # [P, 1, bs]
    # Unwritten slots may hold anything (even NaN): zero their values, mask their scores.
    values.masked_fill_(unused.view(-1, block_size, 1, 1), 0.0)
    out = torch.empty(num_seqs, num_kv_heads, group, head_dim, device=device)  # [S, Hkv, G, D]
    index = seq_of_pair.unsqueeze(1)  # [P, 1]
    for h in range(num_kv_heads):
        # keys[:, :, h] is [P, bs, D] with row stride Hkv * D: bmm reads it without a copy.
        scores = torch.bmm(q_pairs[:, h], keys[:, :, h].transpose(1, 2)) * scale  # [P, G, bs]
        soft_cap(scores, softcap)
        scores.masked_fill_(unused, float("-inf"))
        pair_max = scores.amax(-1)  # [P, G]
        seq_max = torch.full((num_seqs, group), float("-inf"), device=device)
        seq_max.scatter_reduce_(0, index.expand_as(pair_max), pair_max, reduce="amax")  # [S, G]
        weights = torch.exp(scores - seq_max[seq_of_pair].unsqueeze(-1))  # [P, G, bs]
        denom = torch.zeros(num_seqs, group, device=device).index_add_(0, seq_of_pair, weights.sum(-1))
        partial = torch.bmm(weights, values[:, :, h])  # [P, G, D]
        summed = torch.zeros(num_seqs, group, head_dim, device=device).index_add_(0, seq_of_pair, partial)
        out[:, h] = summed / denom.unsqueeze(-1)  # [S, G, D]
    return out.view(num_seqs, num_heads, head_dim).to(query.dtype)


QUERY_TILE = 256  # query rows attended together when a window or soft-cap is set


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
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Ragged query chunks, each causal within itself and full over its cached prefix
    (with ``window > 0``, over the last ``window`` keys up to each query only).

    Without a window or soft-cap each chunk is one SDPA call over its whole context. With
    either, a chunk is cut into tiles of ``QUERY_TILE`` queries, each attending only to the
    keys its queries may see (from the first query's window start to the last query), so a
    tile's score matrix stays small and, with a window, work is about
    ``q_len * (QUERY_TILE + window)`` query-key pairs instead of ``q_len * context_len``.
    """
    check_options(window, softcap)
    out = torch.empty_like(query)
    cu_q = cu_seqlens_q.tolist()
    ctx = context_lens.tolist()
    for i, context_len in enumerate(ctx):
        q_start, q_end = cu_q[i], cu_q[i + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        first_pos = context_len - q_len  # absolute position of the chunk's first query
        step = QUERY_TILE if window > 0 or softcap > 0.0 else q_len
        for t0 in range(0, q_len, step):
            t1 = min(q_len, t0 + step)
            out[q_start + t0 : q_start + t1] = attend_positions(
                query[q_start + t0 : q_start + t1], k_cache, v_cache, block_tables[i],
                first_pos + t0, scale, window, softcap,
            )  # fmt: skip
    return out


def attend_positions(
    q: torch.Tensor,  # [Q, num_heads, head_dim], queries at positions q_first .. q_first + Q - 1
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    table_row: torch.Tensor,  # [max_blocks_per_seq], the sequence's block table
    q_first: int,
    scale: float,
    window: int,
    softcap: float,
) -> torch.Tensor:  # [Q, num_heads, head_dim]
    """Consecutive queries of one sequence against the keys any of them sees: the blocks
    from the one holding the first query's window start (0 without a window) up to the
    last query's own key. Blocks before that, and their table entries, are not read.

    Without a soft-cap this is SDPA with a boolean mask (causal, and the window); with one
    the scores are made explicitly in fp32 (SDPA has no hook between scaling and masking).
    """
    q_len, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    q_end = q_first + q_len  # one past the last query's position: the keys read end here
    key_start = max(0, q_first - window + 1) if window > 0 else 0
    first_block = key_start // block_size
    k0 = first_block * block_size  # position of the first key read
    blocks = table_row[first_block : -(-q_end // block_size)].long()
    keys = k_cache[blocks].reshape(-1, num_kv_heads, head_dim)[: q_end - k0]  # [K, Hkv, D]
    values = v_cache[blocks].reshape(-1, num_kv_heads, head_dim)[: q_end - k0]  # [K, Hkv, D]
    # query j sits at absolute position q_first + j and sees keys k with
    # q_first + j - window < k <= q_first + j (no lower bound without a window).
    q_pos = torch.arange(q_first, q_end, device=q.device)  # [Q]
    k_pos = torch.arange(k0, q_end, device=q.device)  # [K]
    mask = k_pos.unsqueeze(0) <= q_pos.unsqueeze(1)  # [Q, K]
    if window > 0:
        mask &= k_pos.unsqueeze(0) > q_pos.unsqueeze(1) - window
    if softcap > 0.0:
        group = num_heads // num_kv_heads
        qf = q.float().transpose(0, 1)  # [H, Q, D]
        kf = keys.float().transpose(0, 1).repeat_interleave(group, dim=0)  # [H, K, D]
        vf = values.float().transpose(0, 1).repeat_interleave(group, dim=0)  # [H, K, D]
        scores = torch.matmul(qf, kf.transpose(1, 2)).mul_(scale)  # [H, Q, K]
        soft_cap(scores, softcap)
        scores.masked_fill_(~mask, float("-inf"))
        o = torch.matmul(torch.softmax(scores, dim=-1), vf)  # [H, Q, D]
        return o.transpose(0, 1).to(q.dtype)
    k = keys.transpose(0, 1).to(q.dtype)  # [Hkv, K, D]
    v = values.transpose(0, 1).to(q.dtype)  # [Hkv, K, D]
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1), k, v, attn_mask=mask, scale=scale, enable_gqa=num_heads != num_kv_heads
    )  # [H, Q, D]
    return o.transpose(0, 1)
