"""Fused element-wise ops of a Llama-family layer: residual add + RMSNorm, rotary
embedding of q and k in place, and SiLU-and-multiply; and the sampler's per-row maximum
and its index (torch's argmax over a batch of logits runs on one thread).

Three implementations behind one interface: :data:`TORCH_OPS`, plain torch (the reference,
every device and dtype); the native CPU build of ``csrc/fused_cpu.cpp`` for fp32
(:func:`native_ops`), which does each in one pass instead of five to twelve torch ops; and
Triton kernels for CUDA tensors (``triton_fused.py``), one launch each. At a decode step's
row counts those ops cost more in dispatch than in arithmetic: 30 layers of SmolLM2 run
about 1,200 of them per step, and on a GPU each is a kernel launch. The native build
rounds every product and sum as the torch ops do (no fused multiply-add); it differs only
in the order of the norm's sum of squares and in its exp (a polynomial of about 1 ulp).
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

FUSED_NAME = "inflight_fused_cpu"


class AddRmsNorm(Protocol):
    def __call__(self, hidden: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> torch.Tensor: ...


class RopeQK(Protocol):
    def __call__(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 num_heads: int, num_kv_heads: int) -> None: ...


class SiluMul(Protocol):
    def __call__(self, gate_up: torch.Tensor) -> torch.Tensor: ...


class MaxPerRow(Protocol):
    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass(frozen=True)
class LayerOps:
    """The fused ops of one implementation."""

    name: str
    add_rms_norm: AddRmsNorm
    rope_qk_: RopeQK
    silu_mul: SiluMul
    max_per_row: MaxPerRow


def torch_add_rms_norm(hidden: torch.Tensor,  # [T, H], updated in place when delta is given
                       delta: torch.Tensor | None,  # [T, H] or None
                       weight: torch.Tensor,  # [H]
                       eps: float) -> torch.Tensor:  # [T, H]
    """``hidden += delta``; then RMSNorm computed in fp32 as transformers' LlamaRMSNorm."""
    if delta is not None:
        hidden.add_(delta)
    x32 = hidden.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(hidden.dtype)


def torch_rope_qk_(qkv: torch.Tensor,  # [T, (Hq + 2 Hkv) * D], q and k rotated in place
                   cos: torch.Tensor,  # [T, D]
                   sin: torch.Tensor,  # [T, D]
                   num_heads: int, num_kv_heads: int) -> None:
    """Rotate the q and k heads of every row by its position's cos/sin (rotate_half)."""
    num_tokens, head_dim = cos.shape
    rotated = num_heads + num_kv_heads
    x = qkv[:, : rotated * head_dim].view(num_tokens, rotated, head_dim)  # [T, Hq + Hkv, D]
    half = head_dim // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # rotate_half
    x.copy_(x * cos.unsqueeze(1) + turned * sin.unsqueeze(1))


def torch_silu_mul(gate_up: torch.Tensor) -> torch.Tensor:  # [T, 2 I] -> [T, I]
    """``silu(gate) * up`` of a fused gate/up projection's output."""
    gate, up = gate_up.chunk(2, dim=-1)  # 2 x [T, I]
    return F.silu(gate) * up


def torch_max_per_row(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # [R, V] -> [R], [R]
    """Each row's maximum and the index of its first occurrence (``torch.max(x, dim=-1)``:
    a row with a NaN gives NaN and the index of its first NaN)."""
    values, indices = torch.max(x, dim=-1)
    return values, indices


TORCH_OPS = LayerOps(name="torch", add_rms_norm=torch_add_rms_norm, rope_qk_=torch_rope_qk_,
                     silu_mul=torch_silu_mul, max_per_row=torch_max_per_row)


def native_ops(isa: str | None = None) -> LayerOps:
    """The native fp32 CPU ops for ``isa`` (default: the widest this CPU runs), compiled on
    first use; raises if they cannot be built."""
    from kernels import cpu_native

    return _native_ops(isa or cpu_native.default_isa())


@functools.cache
def _native_ops(isa: str) -> LayerOps:
    from kernels import cpu_native

    ext = cpu_native.build(FUSED_NAME, "fused_cpu.cpp", isa, ("-ffp-contract=off",))
    empty = torch.empty(0)

    def add_rms_norm(hidden, delta, weight, eps):
        return ext.add_rms_norm(hidden, empty if delta is None else delta, weight, float(eps))

    return LayerOps(name="cpu", add_rms_norm=add_rms_norm, rope_qk_=ext.rope_qk_,
                    silu_mul=ext.silu_mul, max_per_row=ext.max_per_row)


def ops_for(device: torch.device, dtype: torch.dtype, prefer_native: bool = True) -> LayerOps:
    """Native ops for fp32 on the CPU when they build here, the Triton kernels on CUDA when
    triton is installed, else the torch reference."""
    if prefer_native and device.type == "cuda":
        return _cuda_ops()
    if prefer_native and device.type == "cpu" and dtype == torch.float32:
        try:
            return native_ops()
        except Exception:  # no compiler, no AVX2: slower but the same results
            return TORCH_OPS
    return TORCH_OPS


CUDA_FUSED_ENV = "INFLIGHT_CUDA_FUSED_OPS"  # "on" (default) or "off": the torch ops on CUDA


@functools.cache
def _cuda_ops() -> LayerOps:
    """The Triton kernels (``triton_fused.py``), or the torch reference without triton or
    with ``INFLIGHT_CUDA_FUSED_OPS=off`` (read once per process)."""
    from kernels import cpu_native

    off = cpu_native.env_choice(CUDA_FUSED_ENV, ("on", "off")) == "off"
    if off or importlib.util.find_spec("triton") is None:
        return TORCH_OPS
    from kernels import triton_fused

    return LayerOps(name="triton", add_rms_norm=triton_fused.add_rms_norm,
                    rope_qk_=triton_fused.rope_qk_, silu_mul=triton_fused.silu_mul,
                    max_per_row=torch_max_per_row)
