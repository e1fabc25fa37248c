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


def gather_slots(
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq]
    context_lens: torch.Tensor,  # [num_seqs]
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cache slots of every context token of every sequence, packed without padding.

    Returns ``(slots, seq_index)``, both ``[total_context_tokens]``: the slot of each
    token and the sequence it belongs to.
    """
    lens = context_lens.long()
    num_seqs = lens.numel()
    seq_index = torch.repeat_interleave(torch.arange(num_seqs, device=lens.device), lens)
    starts = torch.cumsum(lens, 0) - lens  # [num_seqs]
    pos = torch.arange(seq_index.numel(), device=lens.device) - starts[seq_index]
    blocks = block_tables.long()[seq_index, torch.div(pos, block_size, rounding_mode="floor")]
    return blocks * block_size + pos % block_size, seq_index


def decode_attention(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq]
    context_lens: torch.Tensor,  # [num_seqs], >= 1, includes the query token itself
    scale: float,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """One query per sequence attending to all its context, vectorized across sequences.

    Keys of all sequences are gathered into one packed list (no padding to the longest
    context); softmax is a segment softmax over each sequence's keys.
    """
    num_seqs, num_heads, head_dim = query.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    slots, seq_index = gather_slots(block_tables, context_lens, block_size)
    keys = k_cache.view(-1, num_kv_heads, head_dim)[slots].float()  # [T, Hkv, D]
    values = v_cache.view(-1, num_kv_heads, head_dim)[slots].float()  # [T, Hkv, D]
    q = query.float().view(num_seqs, num_kv_heads, group, head_dim)  # [S, Hkv, G, D]
    # scores[t, h, g] = q[seq(t), h, g, :] . keys[t, h, :]
    scores = torch.einsum("thgd,thd->thg", q[seq_index], keys) * scale  # [T, Hkv, G]
    index = seq_index.view(-1, 1, 1).expand_as(scores)  # [T, Hkv, G]
    maxes = torch.full((num_seqs, num_kv_heads, group), float("-inf"), device=query.device)
    maxes.scatter_reduce_(0, index, scores, reduce="amax", include_self=True)  # [S, Hkv, G]
    weights = torch.exp(scores - maxes[seq_index])  # [T, Hkv, G]
    denom = torch.zeros_like(maxes).index_add_(0, seq_index, weights)  # [S, Hkv, G]
    weighted = weights.unsqueeze(-1) * values.unsqueeze(2)  # [T, Hkv, G, D]
    out = torch.zeros(num_seqs, num_kv_heads, group, head_dim, device=query.device)
    out.index_add_(0, seq_index, weighted)  # [S, Hkv, G, D]
    out = out / denom.unsqueeze(-1)
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
