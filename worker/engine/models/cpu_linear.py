"""Linear layers with weights prepacked for oneDNN, for the CPU.

``F.linear`` on the CPU calls an sgemm that re-packs the weight matrix on every call; at a
decode step's row counts (1 to ~100) that packing costs more than the arithmetic. oneDNN
can pack a weight once into its blocked layout and run each step's matmul straight from
it. On the 2-core development machine, all 30 SmolLM2 layers' projections take 82 ms at
40 rows through ``F.linear`` and 26 ms prepacked (103 against 330 GFLOP/s,
``benchmarks/matmul_rate.py``); ``benchmarks/step_time.py`` shows the effect on whole steps.

Each output row depends only on its input row, so a sequence's result does not change
with the batch it is in (the engine's batch invariance holds; tests check it).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch
from torch import nn

# oneDNN's primitive cache and the cache of ideep (torch's oneDNN wrapper, which the packed
# linear ops go through); both default to 1,024 entries.
PRIMITIVE_CACHE_ENVS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
PRIMITIVE_CACHE_CAPACITY = 16


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


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ``[out, in]`` packed once into oneDNN's blocked layout."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


def packed_linear(x: torch.Tensor, packed: torch.Tensor,
                  bias: torch.Tensor | None = None) -> torch.Tensor:  # [T, in] -> [T, out]
    """``x W^T + b`` from a weight packed by :func:`pack_weight`."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


class PackedLinear(nn.Module):
    """``y = x W^T + b`` from a weight packed once by oneDNN (CPU, fp32 or bf16)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach()  # [out_features, in_features]
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.packed_weight = pack_weight(weight)
        self.bias = None if linear.bias is None else linear.bias.detach().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, in] -> [num_tokens, out]
        return packed_linear(x, self.packed_weight, self.bias)


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


def pack_linears(module: nn.Module) -> int:
    """Replace every ``nn.Linear`` under ``module`` by a :class:`PackedLinear`, and pack the
    experts of every :class:`PacksExperts` module; returns how many weights were packed. A weight shared with another module (tied embeddings) stays shared
    there; the packed copy serves only the matmul. Caps oneDNN's primitive cache first
    (:func:`cap_primitive_cache`)."""
    cap_primitive_cache()
    return _pack(module)


def _pack(module: nn.Module) -> int:
    replaced = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, PackedLinear(child))
            replaced += 1
        elif isinstance(child, PacksExperts):
            replaced += child.pack_experts(pack_weight)
        else:
            replaced += _pack(child)
    return replaced


@runtime_checkable
class PacksExperts(Protocol):
    """A module holding stacked expert weights that it can pack one expert at a time
    (its own ``nn.Linear`` children, such as a router, are its business)."""

    def pack_experts(self, pack: Callable[[torch.Tensor], torch.Tensor]) -> int: ...
