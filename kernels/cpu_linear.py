"""fp32 linear layers on the CPU from weights packed once into column panels
(``csrc/linear_cpu.cpp``); the reference is ``torch.nn.functional.linear``.

:func:`pack` lays a weight ``[N, K]`` out as ``[P, K, W]``: panels of W output columns
(48 floats with AVX-512, 24 with AVX2: three vectors), each one contiguous run, zero-padded
past N. :func:`linear` then computes ``x W^T + b`` by register tiles that stream each panel
once per block of rows, threads splitting the panels. Its point is the decode step's few
rows, where the matmul is bound by reading the weights: oneDNN's prepacked path reads
them at about 60% of the memory bandwidth at 8 rows, this kernel at full speed (figures in
docs/kernels.md). Each output row is computed the same way whatever the row count, so a
sequence's result never depends on its batch.

Panels hold fp32, or bf16 (``pack(..., dtype=torch.bfloat16)``) for a weight whose every
value is a bf16 value, such as a bf16 checkpoint loaded in fp32 (:func:`exact_in_bf16`):
the kernel widens each bf16 vector to fp32 as it loads it, so the outputs are those of the
fp32 panels bit for bit while the weight is read from half the bytes.
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType

import torch

LINEAR_NAME = "inflight_linear_cpu"
PANEL_DTYPES = (torch.float32, torch.bfloat16)
AHEAD_ENV = "INFLIGHT_CPU_AHEAD"
AHEAD_CHOICES = ("auto", "always", "several-tiles")
# values of a weight compared at a time by exact_in_bf16: its copies stay small (384 KB),
# so loading a model peaks no higher for the check (tests/models/test_load_memory.py)
_CHECK_VALUES = 1 << 16


class NotExactInBf16(ValueError):
    """A weight asked to be packed into bf16 panels holds a value bf16 cannot hold."""


@functools.cache
def cpu_vendor(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's vendor string (``GenuineIntel``, ``AuthenticAMD``), or "" where unknown
    (read once per process: :func:`load` asks on every call)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "vendor_id":
            return value.strip()
    return ""


def ahead_choice() -> str:
    """``INFLIGHT_CPU_AHEAD`` (default ``auto``), checked against :data:`AHEAD_CHOICES`."""
    from kernels import cpu_native

    return cpu_native.env_choice(AHEAD_ENV, AHEAD_CHOICES)


def build_flags(choice: str = "auto", vendor: str = "") -> tuple[str, ...]:
    """The kernel's compile flags for ``choice`` of :data:`AHEAD_CHOICES` on a CPU of
    ``vendor``: whether a call of a single register tile (1-8 rows with AVX-512, 1-4 with
    AVX2) asks for each next panel block into L2 while it computes the current one.

    ``auto`` asks on Intel and leaves it to the hardware prefetcher elsewhere. On an Intel
    Xeon with AMX (2 cores, all of SmolLM2's linears back to back, medians of paired
    rounds), asking took 0.93-1.04x the time at 1 row, 0.74-0.81x at 4 and 0.68-0.72x at 8;
    on AMD EPYCs (Zen 2, 3 and 5) 1.05-1.29x at 1-2 rows and 1.01-1.17x at 4-8
    (docs/kernels.md). Calls of several tiles ask on every CPU. The outputs are the same
    either way.
    """
    if choice == "auto":
        choice = "always" if vendor == "GenuineIntel" else "several-tiles"
    return ("-DLINEAR_AHEAD_MIN_ROWS=1",) if choice == "always" else ()


def chosen_build_flags() -> tuple[str, ...]:
    """:func:`build_flags` for ``INFLIGHT_CPU_AHEAD`` on this machine's CPU."""
    return build_flags(ahead_choice(), cpu_vendor())


@functools.cache
def _extension(isa: str, flags: tuple[str, ...]) -> ModuleType:
    from kernels import cpu_native

    return cpu_native.build(LINEAR_NAME, "linear_cpu.cpp", isa, flags)


def load(isa: str | None = None) -> ModuleType:
    """The build for ``isa`` (default: the widest this CPU runs, or ``INFLIGHT_CPU_ISA``),
    with the flags of :func:`chosen_build_flags`."""
    from kernels import cpu_native

    return _extension(isa or cpu_native.default_isa(), chosen_build_flags())


def exact_in_bf16(weight: torch.Tensor) -> bool:
    """Whether every value of fp32 ``weight`` ``[N, K]`` is a bf16 value (rounding it to
    bf16 changes nothing; a NaN never compares equal, so a weight holding one is not),
    compared a few rows at a time, stopping at the first rows that differ."""
    w = weight.detach()
    step = max(1, _CHECK_VALUES // max(1, w.shape[-1]))  # rows per comparison
    for start in range(0, w.shape[0], step):
        rows = w[start : start + step]
        if not torch.equal(rows.to(torch.bfloat16).to(rows.dtype), rows):
            return False
    return True


def pack(weight: torch.Tensor, ext: ModuleType | None = None,
         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``weight`` ``[N, K]`` fp32 as column panels ``[P, K, W]`` of ``dtype`` (fp32, or bf16
    where :func:`exact_in_bf16`, else :class:`NotExactInBf16`: packing never rounds),
    P = ceil(N / W), the columns past N zero."""
    if dtype not in PANEL_DTYPES:
        raise ValueError(f"panels hold {PANEL_DTYPES}, not {dtype}")
    if dtype != weight.dtype and not exact_in_bf16(weight):
        raise NotExactInBf16("the weight has values that are not bf16 values: its panels stay fp32")
    ext = ext or load()
    width = int(ext.panel_width())
    n, k = weight.shape
    full, rest = divmod(n, width)
    out = weight.new_empty(full + (rest > 0), k, width, dtype=dtype)  # [P, K, W], the only copy made
    w = weight.detach()
    out[:full] = w[: full * width].view(full, width, k).transpose(1, 2)  # [full, K, W]
    if rest:
        out[full].zero_()
        out[full, :, :rest] = w[full * width :].t()  # [K, rest]
    return out


def linear(x: torch.Tensor,  # [M, K]
           packed: torch.Tensor,  # [P, K, W] from pack()
           out_features: int,
           bias: torch.Tensor | None = None,  # [N]
           ext: ModuleType | None = None) -> torch.Tensor:  # [M, N]
    """``x W^T + b`` (fp32) from a weight packed by :func:`pack` (the same build)."""
    return (ext or load()).linear(x, packed, out_features, bias)


def grouped_linear(x: torch.Tensor,  # [M, K], rows grouped by expert
                   offsets: list[int],  # [E + 1], expert e's rows are offsets[e]..offsets[e+1]
                   packed: list[torch.Tensor],  # E x [P, K, W] from pack(), one shape
                   out_features: int,
                   ext: ModuleType | None = None) -> torch.Tensor:  # [M, N]
    """Each expert's rows times its packed weight in one call (no bias): what a call of
    :func:`linear` per expert gives, with one thread pool over every expert's panels."""
    return (ext or load()).grouped_linear(x, offsets, packed, out_features)
