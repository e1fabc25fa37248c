"""Pure-torch paged-attention kernels: the implementation off CUDA and the oracle in tests.

Layouts (shared with the Triton kernels):
- KV cache of one layer: ``[num_blocks, block_size, num_kv_heads, head_dim]`` for K and V.
- ``block_tables``: ``[num_seqs, max_blocks_per_seq]`` int32/int64; entries past a
  sequence's last block are never read.
- Queries are packed: ``[num_tokens, num_heads, head_dim]``, sequence i owning rows
  ``cu_seqlens_q[i]:cu_seqlens_q[i+1]``; those queries are the *last* q_len tokens of its
  ``context_lens[i]`` tokens, whose K/V are already in the cache.

No function computes anything for a padding token: work is proportional to the real
query-key pairs.
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


def decode_attention(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq]
    context_lens: torch.Tensor,  # [num_seqs], >= 1, includes the query token itself
    scale: float,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """One query per sequence attending to all its context, vectorized across sequences.

    Work is organised per (sequence, block) pair: every block a sequence uses is gathered
    once, scores are one batched matmul per KV head over all pairs, and the softmax is a
    segment softmax over each sequence's pairs. Nothing is padded to the longest context;
    only the unused tail slots of each sequence's last block are masked.
    """
    num_seqs, num_heads, head_dim = query.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    device = query.device
    lens = context_lens.long()
    num_blocks = torch.div(lens + block_size - 1, block_size, rounding_mode="floor")  # [S]
    seq_of_pair = torch.repeat_interleave(torch.arange(num_seqs, device=device), num_blocks)  # [P]
    first_pair = torch.cumsum(num_blocks, 0) - num_blocks  # [S]
    block_index = torch.arange(seq_of_pair.numel(), device=device) - first_pair[seq_of_pair]  # [P]
    block_ids = block_tables.long()[seq_of_pair, block_index]  # [P]
    keys = torch.index_select(k_cache, 0, block_ids).float()  # [P, block_size, Hkv, D]
    values = torch.index_select(v_cache, 0, block_ids).float()  # [P, block_size, Hkv, D]
    q = query.float().view(num_seqs, num_kv_heads, group, head_dim)  # [S, Hkv, G, D]
    q_pairs = torch.index_select(q, 0, seq_of_pair)  # [P, Hkv, G, D]
    positions = block_index.unsqueeze(1) * block_size + torch.arange(block_size, device=device)  # [P, bs]
    unused = (positions >= lens[seq_of_pair].unsqueeze(1)).unsqueeze(1)  # [P, 1, bs]
    # Unwritten slots may hold anything (even NaN): zero their values, mask their scores.
    values.masked_fill_(unused.view(-1, block_size, 1, 1), 0.0)
    out = torch.empty(num_seqs, num_kv_heads, group, head_dim, device=device)  # [S, Hkv, G, D]
    index = seq_of_pair.unsqueeze(1)  # [P, 1]
    for h in range(num_kv_heads):
        # keys[:, :, h] is [P, bs, D] with row stride Hkv * D: bmm reads it without a copy.
        scores = torch.bmm(q_pairs[:, h], keys[:, :, h].transpose(1, 2)) * scale  # [P, G, bs]
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


def prefill_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq]
    cu_seqlens_q: torch.Tensor,  # [num_seqs + 1]
    context_lens: torch.Tensor,  # [num_seqs], cached prefix + this chunk
    scale: float,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Ragged query chunks, each causal within itself and full over its cached prefix."""
    num_heads, head_dim = query.shape[1], query.shape[2]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(query)
    cu_q = cu_seqlens_q.tolist()
    ctx = context_lens.tolist()
    for i, context_len in enumerate(ctx):
        q_start, q_end = cu_q[i], cu_q[i + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        num_blocks = -(-context_len // block_size)
        blocks = block_tables[i, :num_blocks].long()
        keys = k_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:context_len]  # [K, Hkv, D]
        values = v_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:context_len]  # [K, Hkv, D]
        q = query[q_start:q_end].transpose(0, 1)  # [H, Q, D]
        k = keys.transpose(0, 1).to(query.dtype)  # [Hkv, K, D]
        v = values.transpose(0, 1).to(query.dtype)  # [Hkv, K, D]
        # query j sits at absolute position context_len - q_len + j and sees keys 0..that.
        q_pos = torch.arange(context_len - q_len, context_len, device=query.device)
        k_pos = torch.arange(context_len, device=query.device)
        mask = k_pos.unsqueeze(0) <= q_pos.unsqueeze(1)  # [Q, K]
        o = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale, enable_gqa=num_heads != num_kv_heads
        )  # [H, Q, D]
        out[q_start:q_end] = o.transpose(0, 1)
    return out
