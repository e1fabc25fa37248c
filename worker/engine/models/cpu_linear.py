"""Linear layers with weights packed once for the CPU's matmuls.

``F.linear`` on the CPU calls an sgemm that re-packs the weight matrix on every call; at a
decode step's row counts (1 to ~100) that packing costs more than the arithmetic. A weight
packed once at load is multiplied straight from its packed layout every step:

- **fp32**: the native kernel's column panels (``kernels/cpu_linear.py``,
  ``csrc/linear_cpu.cpp``), which streams the weights at memory speed at a decode step's
  few rows and runs its register tiles at the FMA units' rate at many (docs/kernels.md).
  With the AVX-512 build, a weight whose values are all bf16 values (a bf16 checkpoint run
  in fp32; published checkpoints mostly are bf16) is kept in bf16 panels and widened as it
  is read: the same outputs bit for bit from half the bytes and half the memory; a decode
  step of 1-2 sequences takes about 0.6x the time, from 8 rows on the same (docs/kernels.md).
  The AVX2 build keeps fp32 panels by default (it gained less and lost 3% at 16 rows);
- **bf16, fp16**: oneDNN's blocked layout (``torch.ops.mkldnn``), where oneDNN has a path
  for the dtype on this CPU.

``INFLIGHT_CPU_LINEAR=onednn`` packs fp32 weights for oneDNN instead of the native kernel
(for comparisons; the default is ``native`` where it builds, else oneDNN).

Each output row depends only on its input row, computed the same way at every row count,
so a sequence's result does not change with the batch it is in (the engine's batch
invariance holds; tests check it).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch
from torch import nn

# oneDNN's primitive cache and the cache of ideep (torch's oneDNN wrapper, which the packed
# linear ops go through); both default to 1,024 entries.
PRIMITIVE_CACHE_ENVS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
PRIMITIVE_CACHE_CAPACITY = 16
LINEAR_ENV = "INFLIGHT_CPU_LINEAR"  # "native" (default) or "onednn", for fp32 weights
LINEAR_CHOICES = ("native", "onednn")
# "auto" (default): bf16 panels for a weight exact in bf16 with the AVX-512 build; "bf16":
# with any build; "fp32": never
PANELS_ENV = "INFLIGHT_CPU_PANELS"
PANEL_CHOICES = ("auto", "bf16", "fp32")


class PackedMatmul(Protocol):
    """A weight ``[out, in]`` packed once: ``x W^T + b`` of ``x`` ``[T, in]``."""

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor: ...


Packer = Callable[[torch.Tensor], PackedMatmul]


def onednn_available(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this torch build has oneDNN's prepacked linear ops for ``dtype`` on this CPU:
    fp32 wherever oneDNN is; bf16 and fp16 only where oneDNN has a path for them (bf16
    needs avx512bw/vl/dq or avx_ne_convert: on an AVX2-only CPU packing a bf16 weight
    fails, and ``F.linear`` has to do)."""
    if not (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    ):
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if dtype == torch.float16:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return dtype == torch.float32


class OneDnnMatmul:
    """A weight in oneDNN's blocked layout (fp32, bf16 or fp16)."""

    def __init__(self, weight: torch.Tensor) -> None:  # [out, in]
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, bias, "none", [], "")


class PanelMatmul:
    """An fp32 weight in the native kernel's column panels (``kernels.cpu_linear``): bf16
    panels when ``try_bf16`` and every value of the weight is a bf16 value (checked once,
    by ``pack``), else fp32; the outputs are the same either way."""

    def __init__(self, weight: torch.Tensor, ext, try_bf16: bool = False) -> None:  # [out, in]
        from kernels import cpu_linear

        self.ext, self.out_features = ext, weight.shape[0]
        panels = None
        if try_bf16:
            with contextlib.suppress(cpu_linear.NotExactInBf16):  # a value bf16 cannot hold: fp32
                panels = cpu_linear.pack(weight, ext, torch.bfloat16)  # [P, in, W]
        self.panels = cpu_linear.pack(weight, ext) if panels is None else panels  # [P, in, W]

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return self.ext.linear(x, self.panels, self.out_features, bias)


def panels_choice() -> str:
    """``INFLIGHT_CPU_PANELS``: auto (the default), bf16 or fp32."""
    from kernels import cpu_native

    return cpu_native.env_choice(PANELS_ENV, PANEL_CHOICES)


def bf16_panels_wanted(isa: str, choice: str = "auto") -> bool:
    """Whether the ``isa`` build packs weights exact in bf16 into bf16 panels: with
    ``choice`` bf16, or auto and the AVX-512 build."""
    return choice == "bf16" or (choice == "auto" and isa == "avx512")


class GroupedPanelMatmul:
    """Every expert's fp32 weight of one MoE projection in the native panels, multiplied in
    one call: rows grouped by expert, ``offsets[e]..offsets[e+1]`` going to expert e."""

    def __init__(self, experts: list[PanelMatmul]) -> None:
        self.ext, self.out_features = experts[0].ext, experts[0].out_features
        self.panels = [expert.panels for expert in experts]  # E x [P, in, W]

    def __call__(self, x: torch.Tensor, offsets: list[int]) -> torch.Tensor:  # [M, in] -> [M, out]
        return self.ext.grouped_linear(x, offsets, self.panels, self.out_features)


def group_experts(experts: list[PackedMatmul]) -> GroupedPanelMatmul | None:
    """One call for all of ``experts`` where each is in the native panels of one build, one
    shape and one dtype; else None (the experts run one call each)."""
    if not experts or not all(isinstance(e, PanelMatmul) for e in experts):
        return None
    panels = [e for e in experts if isinstance(e, PanelMatmul)]
    first = panels[0]
    if any(e.ext is not first.ext or e.panels.shape != first.panels.shape
           or e.panels.dtype != first.panels.dtype for e in panels):
        return None
    return GroupedPanelMatmul(panels)


def packer_for(dtype: torch.dtype) -> Packer | None:
    """How to pack a weight of ``dtype`` here: the native panels for fp32 (unless
    ``INFLIGHT_CPU_LINEAR=onednn``, or where the kernel cannot build), in bf16 where
    :func:`bf16_panels_wanted` and the weight allow; oneDNN where it has a path for the dtype, else None
    (``F.linear`` stays)."""
    from kernels import cpu_linear, cpu_native

    choice = cpu_native.env_choice(LINEAR_ENV, LINEAR_CHOICES)
    if dtype == torch.float32 and choice == "native":
        panels = panels_choice()
        cpu_linear.ahead_choice()  # a bad INFLIGHT_CPU_AHEAD is refused, not taken for a failed build
        try:
            isa = cpu_native.default_isa()
            ext = cpu_linear.load(isa)
        except Exception:  # no compiler, no AVX2: oneDNN's packing still beats F.linear
            ext = None
        if ext is not None:
            try_bf16 = bf16_panels_wanted(isa, panels)
            return lambda weight: PanelMatmul(weight, ext, try_bf16)
    if onednn_available(dtype):
        return OneDnnMatmul
    return None


class PackedLinear(nn.Module):
    """``y = x W^T + b`` from a weight packed once (:func:`packer_for`)."""

    def __init__(self, linear: nn.Linear, pack: Packer) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.matmul = pack(linear.weight.detach())  # [out_features, in_features], packed
        self.bias = None if linear.bias is None else linear.bias.detach().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, in] -> [num_tokens, out]
        return self.matmul(x, self.bias)


def cap_primitive_cache() -> None:
    """Keep oneDNN's and ideep's primitive caches small unless the user chose a size.

    Both cache one primitive (with its buffers) per (layer shape, row count), and a
    continuous batch's row count changes nearly every step, so at their default of 1,024
    entries they only grow: the oneDNN cache by about 180 MB over the chat workload (peak
    RSS 2,481 -> 2,302 MiB with 16), the ideep cache by about 300 MB over 20,000 short
    requests of the tiny model (712 MiB against a flat 424 with 16). Making a primitive
    costs microseconds against a step's milliseconds, so small caches cost no speed
    (docs/benchmarks.md). Both libraries read their variable when they make the cache, at
    the first primitive, so this runs before any weight is packed.
    """
    for name in PRIMITIVE_CACHE_ENVS:
        os.environ.setdefault(name, str(PRIMITIVE_CACHE_CAPACITY))


def pack_linears(module: nn.Module, pack: Packer) -> int:
    """Replace every ``nn.Linear`` under ``module`` by a :class:`PackedLinear`, and pack the
    experts of every :class:`PacksExperts` module, with ``pack``; returns how many weights
    were packed. A weight shared with another module (tied embeddings) stays shared there;
    the packed copy serves only the matmul. Caps oneDNN's primitive caches first
    (:func:`cap_primitive_cache`: its matmuls still serve attention's long prefills)."""
    cap_primitive_cache()
    return _pack(module, pack)


def _pack(module: nn.Module, pack: Packer) -> int:
    replaced = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, PackedLinear(child, pack))
            replaced += 1
        elif isinstance(child, PacksExperts):
            replaced += child.pack_experts(pack)
        else:
            replaced += _pack(child, pack)
    return replaced


@runtime_checkable
class PacksExperts(Protocol):
    """A module holding stacked expert weights that it can pack one expert at a time
    (its own ``nn.Linear`` children, such as a router, are its business)."""

    def pack_experts(self, pack: Packer) -> int: ...
