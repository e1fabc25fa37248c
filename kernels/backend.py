"""Choose the attention implementation for a device."""

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


def get_backend(device: torch.device | str, prefer: str | None = None) -> AttentionBackend:
    """Triton on CUDA (when importable), pure torch elsewhere; ``prefer`` forces one."""
    device = torch.device(device)
    want = prefer or ("triton" if device.type == "cuda" else "torch")
    if want == "torch":
        return TORCH_BACKEND
    if want == "triton":
        try:
            from kernels.triton_backend import TRITON_BACKEND
        except ImportError as exc:  # no triton build, or kernels not shipped yet
            if prefer == "triton":
                raise RuntimeError(f"the Triton backend is unavailable: {exc}") from exc
            return TORCH_BACKEND
        return TRITON_BACKEND
    raise ValueError(f"unknown attention backend {want!r}; expected 'torch' or 'triton'")
