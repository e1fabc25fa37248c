"""Choose the attention implementation for a device."""

from __future__ import annotations

import warnings
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
    """The backend for ``device``; ``prefer`` ("torch", "cpu", "triton") forces one.

    By default CUDA gets Triton and the CPU gets the native C++ kernel; either falls back
    to pure torch when it cannot be imported or built (a warning says so).
    """
    device = torch.device(device)
    want = prefer or ("triton" if device.type == "cuda" else "cpu")
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
    if want == "cpu":
        if device.type != "cpu":
            raise ValueError(f"the 'cpu' attention backend cannot run on {device}")
        from kernels import cpu_native

        try:
            return cpu_native.make_backend()
        except Exception as exc:  # no compiler or ninja: slower but correct
            if prefer == "cpu":
                raise RuntimeError(f"the native CPU backend does not build here: {exc}") from exc
            warnings.warn(f"native CPU attention unavailable, using pure torch: {exc}", stacklevel=2)
            return TORCH_BACKEND
    raise ValueError(f"unknown attention backend {want!r}; expected 'torch', 'cpu' or 'triton'")
