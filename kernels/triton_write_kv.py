"""Triton kernel storing each new token's K and V into its paged-cache slot.

Same contract as :func:`kernels.reference.write_kv`: slot ``s`` is token ``s % block_size``
of cache block ``s // block_size``; a negative slot means "do not store" (padding).
One program copies one token's K and V for all KV heads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_common import check_cache_pair, check_float, check_same_device


@triton.jit
def _write_kv_kernel(
    key_ptr,  # [num_tokens, num_kv_heads, head_dim]
    value_ptr,  # [num_tokens, num_kv_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_ptr,  # [num_tokens], int32/int64, < 0 skipped
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,  # cache stride of a block (shared by K and V caches)
    stride_cs,  # cache stride of a slot within a block
    stride_ch,  # cache stride of a head
    num_kv_heads,
    head_dim,
    block_size,
    BLOCK_H: tl.constexpr,  # next power of two >= num_kv_heads
    BLOCK_D: tl.constexpr,  # next power of two >= head_dim
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    block = slot // block_size
    offset = slot % block_size

    heads = tl.arange(0, BLOCK_H)  # [BLOCK_H]
    dims = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    # The slot test is made on a tensor, not a scalar: Triton 3.9's interpreter mis-types
    # `bool tensor & bool scalar` (int32 mask). Same code on the GPU either way.
    slots = tl.full([BLOCK_H], 0, dtype=tl.int64) + slot  # [BLOCK_H]
    keep = (heads < num_kv_heads) & (slots >= 0)  # [BLOCK_H]
    mask = keep[:, None] & (dims[None, :] < head_dim)  # [BLOCK_H, BLOCK_D]

    k = tl.load(
        key_ptr + token * stride_kt + heads[:, None] * stride_kh + dims[None, :],
        mask=mask,
    )  # [BLOCK_H, BLOCK_D]
    v = tl.load(
        value_ptr + token * stride_vt + heads[:, None] * stride_vh + dims[None, :],
        mask=mask,
    )  # [BLOCK_H, BLOCK_D]
    # 64-bit: block * stride_cb exceeds 2**31 for caches larger than 2 GiB elements.
    cache_off = block * stride_cb + offset * stride_cs + heads[:, None] * stride_ch + dims[None, :]
    tl.store(k_cache_ptr + cache_off, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + cache_off, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens], slot = block * block_size + offset; < 0 skipped
) -> None:
    """Store each token's K and V at its slot in place; tokens with a negative slot are skipped.

    ``key``/``value`` may be strided views (e.g. slices of a fused QKV projection) as long as
    their last dimension is contiguous; they are cast to the cache dtype on store. Slots must
    be below ``num_blocks * block_size`` (not checked: that would need a device sync).
    """
    check_float("key", key, 3)
    check_float("value", value, 3)
    check_cache_pair(k_cache, v_cache)
    num_tokens, num_kv_heads, head_dim = key.shape
    if value.shape != key.shape:
        raise ValueError(f"value shape {tuple(value.shape)} != key shape {tuple(key.shape)}")
    if (k_cache.shape[2], k_cache.shape[3]) != (num_kv_heads, head_dim):
        raise ValueError(
            f"key is [num_tokens, {num_kv_heads}, {head_dim}] but the cache holds "
            f"{k_cache.shape[2]} KV heads of dim {k_cache.shape[3]}"
        )
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != num_tokens:
        raise ValueError(
            f"slot_mapping must be [num_tokens={num_tokens}], got {tuple(slot_mapping.shape)}"
        )
    if slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slot_mapping must be int32 or int64, got {slot_mapping.dtype}")
    check_same_device(key=key, value=value, k_cache=k_cache, slot_mapping=slot_mapping)
    if num_tokens == 0:
        return
    slot_mapping = slot_mapping.contiguous()
    _write_kv_kernel[(num_tokens,)](
        key_ptr=key,
        value_ptr=value,
        k_cache_ptr=k_cache,
        v_cache_ptr=v_cache,
        slot_ptr=slot_mapping,
        stride_kt=key.stride(0),
        stride_kh=key.stride(1),
        stride_vt=value.stride(0),
        stride_vh=value.stride(1),
        stride_cb=k_cache.stride(0),
        stride_cs=k_cache.stride(1),
        stride_ch=k_cache.stride(2),
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=k_cache.shape[1],
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
    )
