"""The attention backend interface: the three paged-KV operations one implementation
provides, and the pure-torch one every other is tested against."""

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
    def __call__(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        scale: float,
    ) -> torch.Tensor: ...


class PrefillAttention(Protocol):
    def __call__(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        context_lens: torch.Tensor,
        scale: float,
    ) -> torch.Tensor: ...


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
