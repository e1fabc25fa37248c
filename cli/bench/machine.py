"""What the benchmark ran on: the CPU's model and vector extensions, library versions, and
the resident memory of a run.

Figures from one machine say little about another (the same engine ran three times slower
per step on an AVX2-only machine than on an AVX-512 one), so every result names its CPU.
"""

from __future__ import annotations

import os
import platform
import threading
import time
from pathlib import Path
from typing import Any

VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                "avx512_fp16", "amx_bf16", "amx_int8", "amx_tile")


def cpu_description(cpuinfo: str | None = None) -> dict[str, Any]:
    """The CPU's model name and which of :data:`VECTOR_FLAGS` it has (Linux /proc/cpuinfo)."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
    model: str | None = None
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model is None:
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return {"model": model or platform.processor() or None, "vector_extensions": [f for f in VECTOR_FLAGS if f in flags]}


def mapped_allocator(maps: str | None = None) -> str:
    """Which allocator this process runs on: ``tcmalloc`` or ``jemalloc`` when one is mapped
    (``maps``: the text of /proc/self/maps; the ``inflight`` engine commands preload
    tcmalloc where it is installed), else ``system``."""
    if maps is None:
        path = Path("/proc/self/maps")
        maps = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
    for name in ("tcmalloc", "jemalloc"):
        if f"lib{name}" in maps:
            return name
    return "system"


def machine_description() -> dict[str, Any]:
    """CPU, core count, torch's CPU capability and threads, the native kernel's build, the
    memory allocator, and library versions."""
    import torch
    import transformers

    from kernels import cpu_native

    try:
        kernel_isa: str | None = cpu_native.default_isa()
    except (RuntimeError, ValueError):
        kernel_isa = None
    return {"cpu": cpu_description(), "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "native_kernel_isa": kernel_isa, "allocator": mapped_allocator(),
            "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version()}


def current_rss_bytes(pid: int | None = None) -> int:
    """The resident set size now of this process, or of process ``pid`` and all its
    descendants (0 where /proc is missing or the process is gone)."""
    if pid is None:
        return _statm_rss(Path("/proc/self/statm"))
    return sum(_statm_rss(Path(f"/proc/{p}/statm")) for p in _process_tree(pid))


def _statm_rss(path: Path) -> int:
    try:
        pages = int(path.read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def _process_tree(pid: int) -> list[int]:
    """``pid`` and every descendant of it (from /proc/<pid>/task/*/children)."""
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                todo.extend(int(child) for child in task.read_text().split())
            except (OSError, ValueError):
                continue
    return tree


class RssSampler:
    """The peak of :func:`current_rss_bytes` while the ``with`` block runs (sampled every
    ``interval`` seconds in a thread), so each run gets its own peak, not the process's.
    With ``pid`` it watches that process and its children instead of this one, and keeps
    the samples as ``(seconds since start, bytes)`` in ``series``."""

    def __init__(self, interval: float = 0.1, pid: int | None = None) -> None:
        self.interval = interval
        self.pid = pid
        self.peak = 0
        self.series: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = time.monotonic()

    def _run(self) -> None:
        while True:
            rss = current_rss_bytes(self.pid)
            self.peak = max(self.peak, rss)
            if self.pid is not None and rss:
                self.series.append((time.monotonic() - self._started, rss))
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> RssSampler:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, current_rss_bytes(self.pid))
