"""Triton kernels for a layer's element-wise work on CUDA: residual add + RMSNorm, rotary
embedding of q and k in place, and SiLU-and-multiply, one launch each.

The torch reference (``kernels.cpu_fused.TORCH_OPS``) runs each of them as five to twelve
kernels; a decode step of a small batch is bound by the number of launches, not by their
bytes (16 layers of a 1B model ran about 500 of them per step, each a few microseconds even
inside a CUDA graph). Each kernel here rounds where the torch ops round (a bf16 product is
rounded to bf16 before it is added, as two torch ops would), and fp32 runs with
``enable_fp_fusion=False`` so no multiply and add are contracted into one FMA that torch's
separate kernels would not; what may differ is the order of the norm's sum of squares and
Triton's exp (a few ulp of fp32 before SiLU's rounding).

Importing this module imports triton; :func:`kernels.cpu_fused.ops_for` imports it only
for a CUDA tensor (and makes the LayerOps of these three and torch's per-row maximum), so a
CPU-only install without triton still works.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_common import check_float, check_same_device

SILU_BLOCK = 1024  # columns of the SiLU-and-multiply output per program


@triton.jit
def _add_rms_norm_kernel(
    hidden_ptr,  # [T, W], row stride stride_h; hidden += delta stored here
    delta_ptr,  # [T, W], row stride stride_d (unused without HAS_DELTA)
    weight_ptr,  # [W]
    out_ptr,  # [T, W], row stride stride_o
    stride_h,
    stride_d,
    stride_o,
    width,
    eps,
    HAS_DELTA: tl.constexpr,
    BLOCK: tl.constexpr,  # next power of two >= width
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)  # [BLOCK]
    mask = cols < width
    x = tl.load(hidden_ptr + row * stride_h + cols, mask=mask, other=0.0)  # [BLOCK], hidden's dtype
    if HAS_DELTA:
        d = tl.load(delta_ptr + row * stride_d + cols, mask=mask, other=0.0)  # [BLOCK]
        x = (x.to(tl.float32) + d.to(tl.float32)).to(hidden_ptr.dtype.element_ty)  # torch's add_
        tl.store(hidden_ptr + row * stride_h + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x32 * x32, axis=0) / width + eps)
    normed = (x32 * rstd).to(hidden_ptr.dtype.element_ty)  # transformers rounds before the weight
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0)  # [BLOCK]
    y = w.to(tl.float32) * normed.to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_qk_kernel(
    qkv_ptr,  # [T, (Hq + 2 Hkv) * D], row stride stride_t; the first Hq + Hkv heads rotated
    cos_ptr,  # [T, D], row stride stride_c
    sin_ptr,  # [T, D], row stride stride_s
    stride_t,
    stride_c,
    stride_s,
    num_rotated,  # Hq + Hkv
    head_dim,
    BLOCK_H: tl.constexpr,  # next power of two >= num_rotated
    BLOCK_HALF: tl.constexpr,  # next power of two >= head_dim // 2
):
    token = tl.program_id(0).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)  # [BLOCK_H]
    dims = tl.arange(0, BLOCK_HALF)  # [BLOCK_HALF]
    half = head_dim // 2
    dim_mask = dims < half
    mask = (heads < num_rotated)[:, None] & dim_mask[None, :]  # [BLOCK_H, BLOCK_HALF]
    first = qkv_ptr + token * stride_t + heads[:, None] * head_dim + dims[None, :]
    x1 = tl.load(first, mask=mask, other=0.0)  # [BLOCK_H, BLOCK_HALF], first half of each head
    x2 = tl.load(first + half, mask=mask, other=0.0)  # second half
    c1 = tl.load(cos_ptr + token * stride_c + dims, mask=dim_mask, other=0.0)[None, :]  # [1, BLOCK_HALF]
    c2 = tl.load(cos_ptr + token * stride_c + half + dims, mask=dim_mask, other=0.0)[None, :]
    s1 = tl.load(sin_ptr + token * stride_s + dims, mask=dim_mask, other=0.0)[None, :]
    s2 = tl.load(sin_ptr + token * stride_s + half + dims, mask=dim_mask, other=0.0)[None, :]
    dtype = qkv_ptr.dtype.element_ty
    # x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1); each product rounded as a
    # torch op rounds it, then the sum.
    a1 = (x1.to(tl.float32) * c1.to(tl.float32)).to(dtype).to(tl.float32)
    b1 = (-(x2.to(tl.float32) * s1.to(tl.float32))).to(dtype).to(tl.float32)
    a2 = (x2.to(tl.float32) * c2.to(tl.float32)).to(dtype).to(tl.float32)
    b2 = (x1.to(tl.float32) * s2.to(tl.float32)).to(dtype).to(tl.float32)
    tl.store(first, (a1 + b1).to(dtype), mask=mask)
    tl.store(first + half, (a2 + b2).to(dtype), mask=mask)


@triton.jit
def _silu_mul_kernel(
    gate_up_ptr,  # [T, 2 I], row stride stride_g: gate then up
    out_ptr,  # [T, I], contiguous
    stride_g,
    inter,  # I
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    mask = cols < inter
    g = tl.load(gate_up_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gate_up_ptr + row * stride_g + inter + cols, mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    silu = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)  # F.silu's output, rounded
    tl.store(out_ptr + row * inter + cols, (silu * u).to(dtype), mask=mask)


def add_rms_norm(hidden: torch.Tensor,  # [T, W], updated in place when delta is given
                 delta: torch.Tensor | None,  # [T, W] or None
                 weight: torch.Tensor,  # [W]
                 eps: float) -> torch.Tensor:  # [T, W], dtype of weight * hidden
    """``hidden += delta``; then RMSNorm in fp32, rounded to hidden's dtype, times ``weight``
    (:func:`kernels.cpu_fused.torch_add_rms_norm`), in one launch."""
    check_float("hidden", hidden, 2)
    width = hidden.shape[1]
    if weight.dim() != 1 or weight.shape[0] != width:
        raise ValueError(f"weight must be [{width}], got {tuple(weight.shape)}")
    if delta is not None:
        check_float("delta", delta, 2)
        if delta.shape != hidden.shape or delta.dtype != hidden.dtype:
            raise ValueError(f"delta {tuple(delta.shape)} {delta.dtype} must match hidden "
                             f"{tuple(hidden.shape)} {hidden.dtype}")
        check_same_device(hidden=hidden, delta=delta, weight=weight)
    else:
        check_same_device(hidden=hidden, weight=weight)
    weight = weight.contiguous()
    out = torch.empty(hidden.shape, dtype=torch.result_type(weight, hidden), device=hidden.device)
    if hidden.shape[0] == 0:
        return out
    block = triton.next_power_of_2(width)
    _add_rms_norm_kernel[(hidden.shape[0],)](
        hidden, hidden if delta is None else delta, weight, out,
        hidden.stride(0), 0 if delta is None else delta.stride(0), out.stride(0), width, float(eps),
        HAS_DELTA=delta is not None, BLOCK=block, num_warps=8 if block >= 4096 else 4,
        enable_fp_fusion=False,
    )
    return out


def rope_qk_(qkv: torch.Tensor,  # [T, (Hq + 2 Hkv) * D], q and k rotated in place
             cos: torch.Tensor,  # [T, D], qkv's dtype
             sin: torch.Tensor,  # [T, D], qkv's dtype
             num_heads: int, num_kv_heads: int) -> None:
    """Rotate the q and k heads of every row by its position's cos/sin (rotate_half), in
    one launch (:func:`kernels.cpu_fused.torch_rope_qk_`)."""
    check_float("qkv", qkv, 2)
    check_float("cos", cos, 2)
    check_float("sin", sin, 2)
    num_tokens, head_dim = cos.shape
    if sin.shape != cos.shape or qkv.shape[0] != num_tokens or head_dim % 2:
        raise ValueError(f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must be "
                         f"[{qkv.shape[0]}, even head_dim]")
    rotated = num_heads + num_kv_heads
    if qkv.shape[1] < rotated * head_dim:
        raise ValueError(f"qkv has {qkv.shape[1]} columns, fewer than {rotated} heads of {head_dim}")
    if cos.dtype != qkv.dtype or sin.dtype != qkv.dtype:
        raise ValueError(f"cos/sin ({cos.dtype}, {sin.dtype}) must be qkv's dtype {qkv.dtype}")
    check_same_device(qkv=qkv, cos=cos, sin=sin)
    if num_tokens == 0:
        return
    _rope_qk_kernel[(num_tokens,)](
        qkv, cos, sin, qkv.stride(0), cos.stride(0), sin.stride(0), rotated, head_dim,
        BLOCK_H=triton.next_power_of_2(rotated), BLOCK_HALF=triton.next_power_of_2(head_dim // 2),
        enable_fp_fusion=False,
    )


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:  # [T, 2 I] -> [T, I]
    """``silu(gate) * up`` of a fused gate/up projection's output, in one launch
    (:func:`kernels.cpu_fused.torch_silu_mul`)."""
    check_float("gate_up", gate_up, 2)
    num_tokens, both = gate_up.shape
    if both % 2:
        raise ValueError(f"gate_up must have an even number of columns, got {both}")
    inter = both // 2
    out = torch.empty((num_tokens, inter), dtype=gate_up.dtype, device=gate_up.device)
    if num_tokens == 0:
        return out
    _silu_mul_kernel[(num_tokens, triton.cdiv(inter, SILU_BLOCK))](
        gate_up, out, gate_up.stride(0), inter, BLOCK=SILU_BLOCK, enable_fp_fusion=False,
    )
    return out
