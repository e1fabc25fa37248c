"""Timing and memory measurements that work on CUDA (events, L2 flushed) and on the CPU.

On the CPU the same functions use ``time.perf_counter`` and skip the cache flush, so the
script runs end to end there; those figures describe the CPU, never a GPU.
"""

from __future__ import annotations

import gc
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

L2_FLUSH_BYTES = 256 * 2**20  # larger than any current GPU's L2 (H200: 60 MiB)


def is_cuda(device: torch.device) -> bool:
    """Whether ``device`` is a CUDA device."""
    return device.type == "cuda"


def synchronize(device: torch.device) -> None:
    """Wait for queued work on ``device`` (nothing to wait for on the CPU)."""
    if is_cuda(device):
        torch.cuda.synchronize(device)


def release_memory(device: torch.device) -> None:
    """On CUDA, collect garbage and return cached blocks (models freed between runs); on
    the CPU reference counting frees them and a full collection costs ~0.4 s each time."""
    if is_cuda(device):
        gc.collect()
        torch.cuda.empty_cache()


def describe(device: torch.device) -> dict[str, Any]:
    """Name, memory and library versions of the machine the run is on."""
    import transformers

    info: dict[str, Any] = {
        "type": device.type, "torch": torch.__version__,
        "transformers": transformers.__version__, "python": platform.python_version(),
        "platform": platform.platform(),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if is_cuda(device):
        props = torch.cuda.get_device_properties(device)
        info.update(name=props.name, memory_gib=round(props.total_memory / 2**30, 1),
                    sms=props.multi_processor_count, cuda=torch.version.cuda,
                    capability=f"{props.major}.{props.minor}")
        info["description"] = f"{props.name} ({info['memory_gib']} GiB, CUDA {torch.version.cuda})"
    else:
        info["name"] = platform.processor() or platform.machine()
        info["description"] = f"CPU {info['name']}, {torch.get_num_threads()} torch threads"
    return info


def time_ms(fn: Callable[[], object], device: torch.device, *, iters: int, warmup: int = 2,
            flush: torch.Tensor | None = None) -> float:
    """Median milliseconds of ``fn`` over ``iters`` calls: CUDA events (``flush`` zeroed,
    untimed, before each call so no call reads a warm L2) or wall clock on the CPU."""
    for _ in range(warmup):
        fn()
    if not is_cuda(device):
        samples = []
        for _ in range(iters):
            began = time.perf_counter()
            fn()
            samples.append(1000 * (time.perf_counter() - began))
        return statistics.median(samples)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for start, end in zip(starts, ends, strict=True):
        if flush is not None:
            flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))


def flush_buffer(device: torch.device) -> torch.Tensor | None:
    """A buffer larger than L2 to zero between timed CUDA launches (None on the CPU)."""
    return torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device) if is_cuda(device) else None


def copy_bandwidth_gbs(device: torch.device, nbytes: int, *, iters: int,
                       flush: torch.Tensor | None = None) -> float:
    """GB/s of a same-device copy of ``nbytes``: bytes read + bytes written over its time."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device, iters=iters, flush=flush)
    return 2 * nbytes / ms / 1e6
