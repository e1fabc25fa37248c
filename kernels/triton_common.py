"""Helpers shared by the Triton kernels: host-side argument checks (clear ValueErrors before
a launch), the operand type of ``tl.dot``, and :func:`tanh`, the device function behind
attention-logit soft-capping."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)


def check_float(name: str, t: torch.Tensor, dims: int) -> None:
    """``t`` has ``dims`` dimensions, a supported float dtype and a contiguous last dim."""
    if t.dim() != dims:
        raise ValueError(f"{name} must have {dims} dimensions, got shape {tuple(t.shape)}")
    if t.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension, strides {t.stride()}")


def check_index(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    """``t`` is an int32/int64 tensor of exactly ``shape``."""
    if t.dtype not in INDEX_DTYPES:
        raise ValueError(f"{name} must be int32 or int64, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")


def check_cache_pair(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """K and V caches: ``[num_blocks, block_size, num_kv_heads, head_dim]``, same layout."""
    check_float("k_cache", k_cache, 4)
    check_float("v_cache", v_cache, 4)
    if k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
        raise ValueError(
            f"k_cache {tuple(k_cache.shape)} {k_cache.dtype} and v_cache "
            f"{tuple(v_cache.shape)} {v_cache.dtype} must match"
        )
    if k_cache.stride() != v_cache.stride():
        raise ValueError(
            f"k_cache and v_cache must share strides, got {k_cache.stride()} and {v_cache.stride()}"
        )


def check_same_device(**tensors: torch.Tensor) -> None:
    """All tensors live on one device."""
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        raise ValueError(f"tensors must be on one device, got {devices}")


def check_attention_args(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq]
    context_lens: torch.Tensor,  # [num_seqs]
) -> None:
    """Checks shared by decode and prefill attention."""
    check_float("query", query, 3)
    check_cache_pair(k_cache, v_cache)
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"query head_dim {head_dim} != cache head_dim {k_cache.shape[3]}")
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads {num_heads} must be a multiple of num_kv_heads {num_kv_heads}")
    if query.dtype != k_cache.dtype:
        raise ValueError(f"query dtype {query.dtype} != cache dtype {k_cache.dtype}")
    if block_tables.dim() != 2:
        raise ValueError(f"block_tables must be 2-D, got shape {tuple(block_tables.shape)}")
    check_index("block_tables", block_tables, tuple(block_tables.shape))
    if block_tables.shape[1] > 1 and block_tables.stride(1) != 1:
        raise ValueError(f"block_tables rows must be contiguous, strides {block_tables.stride()}")
    check_index("context_lens", context_lens, (block_tables.shape[0],))
    check_same_device(
        query=query,
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=block_tables,
        context_lens=context_lens,
    )


def check_out(
    out: torch.Tensor | None, like: torch.Tensor
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Return ``out`` after checking it matches ``like``, or a new contiguous empty tensor."""
    if out is None:
        return torch.empty(like.shape, dtype=like.dtype, device=like.device)
    if out.shape != like.shape or out.dtype != like.dtype or out.device != like.device:
        raise ValueError(
            f"out must be {tuple(like.shape)} {like.dtype} on {like.device}, got "
            f"{tuple(out.shape)} {out.dtype} on {out.device}"
        )
    check_float("out", out, 3)
    return out


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def dot_dtype(dtype: torch.dtype) -> tl.dtype:
    """Operand type of the kernels' ``tl.dot``: the input's own type (tensor cores on the GPU).

    Under the interpreter, bf16 operands are widened to fp32 first: Triton 3.9's interpreter
    multiplies bf16 bit patterns as integers. Products of bf16 values are exact in fp32, so
    the result is the GPU's bf16 dot with fp32 accumulation.
    """
    if dtype == torch.bfloat16:
        return tl.float32 if interpreting() else tl.bfloat16
    return tl.float16 if dtype == torch.float16 else tl.float32


@triton.jit
def tanh(x):
    """tanh of each element, to a few fp32 ulp (Cephes' tanhf; Triton has no portable one).

    Below ``|x| = 0.625`` an odd degree-11 polynomial (no cancellation near 0, where
    soft-capped scores usually sit), above it ``1 - 2 / (e^(2|x|) + 1)`` with the sign put
    back; a large ``|x|`` gives exactly +-1 (the exponential is +inf).
    """
    ax = tl.abs(x)
    z = x * x
    p = -5.70498872745e-3 * z + 2.06390887954e-2
    p = p * z - 5.37397155531e-2
    p = p * z + 1.33314422036e-1
    p = p * z - 3.33332819422e-1
    small = p * z * x + x
    large = 1.0 - 2.0 / (tl.exp(2.0 * ax) + 1.0)
    large = tl.where(x < 0, -large, large)
    return tl.where(ax < 0.625, small, large)
