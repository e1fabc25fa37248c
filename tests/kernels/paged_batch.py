"""A paged KV cache filled with random keys and values, shared by the kernel tests.

No test framework here (no pytest, no hypothesis): tests/kernels/test_triton.py imports
it on GPU machines that carry only torch, triton and pytest. Tensors are created on the
default device (``with torch.device("cuda"):`` puts the whole batch there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


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
    # On the default device, so the Triton tests can build their batches on CUDA.
    gen = torch.Generator(device=torch.get_default_device()).manual_seed(seed)
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


def cu_seqlens(q_lens: list[int]) -> torch.Tensor:
    """``[0, q0, q0 + q1, ...]`` as int64."""
    return torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int64)
