"""The attention backend interface: the three paged-KV operations one implementation
provides, and the pure-torch one every other is tested against.

Both attention operations take a per-layer sliding ``window`` (0: none; W > 0: the query at
position p sees keys p - W < k <= p, Hugging Face's ``sliding_window_overlay``, and blocks
wholly before the window are never read) and an attention-logit ``softcap`` (0: none;
c > 0: scores become ``c * tanh(scale * q.k / c)`` before masking, as Gemma 2's
``attn_logit_softcapping``). See kernels/reference.py for the full contract."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from kernels import reference


class WriteKV(Protocol):
    def __call__(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None: ...


class DecodeAttention(Protocol):
    """One query per sequence over its paged context (kernels.reference.decode_attention)."""

    def __call__(
        self,
        query: torch.Tensor,  # [num_seqs, num_heads, head_dim]
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq]
        context_lens: torch.Tensor,  # [num_seqs]
        scale: float,
        window: int = 0,  # sliding window in keys, the query's own included; 0: none
        softcap: float = 0.0,  # attention-logit soft-cap; 0: none
    ) -> torch.Tensor: ...  # [num_seqs, num_heads, head_dim]


class PrefillAttention(Protocol):
    """Ragged causal query chunks over a cached prefix (kernels.reference.prefill_attention)."""

    def __call__(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq]
        cu_seqlens_q: torch.Tensor,  # [num_seqs + 1]
        context_lens: torch.Tensor,  # [num_seqs]
        scale: float,
        window: int = 0,  # sliding window in keys, the query's own included; 0: none
        softcap: float = 0.0,  # attention-logit soft-cap; 0: none
    ) -> torch.Tensor: ...  # [num_tokens, num_heads, head_dim]


@dataclass(frozen=True)
class AttentionBackend:
    """The three paged-KV operations of one implementation (see kernels/reference.py)."""

    name: str
    write_kv: WriteKV
    decode_attention: DecodeAttention
    prefill_attention: PrefillAttention


TORCH_BACKEND = AttentionBackend(
    name="torch",
    write_kv=reference.write_kv,
    decode_attention=reference.decode_attention,
    prefill_attention=reference.prefill_attention,
)
