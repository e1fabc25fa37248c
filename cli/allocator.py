"""Run the engine's commands on tcmalloc where the machine has it.

A continuous batch allocates and frees activations of a new size nearly every step (tens
of tensors per layer, thirty layers). glibc's malloc serves that slowly (free-list
consolidation, large blocks mapped and unmapped, their pages faulted in again); tcmalloc
keeps freed memory in per-size lists. On the chat workload the default fp32 engine ran at
374 tok/s on glibc and 400 on tcmalloc with the same peak memory (jemalloc: 356;
docs/benchmarks.md). vLLM's CPU guide preloads tcmalloc too, and our benchmark runs vLLM
with it.

An allocator can only be chosen before the process starts, so the engine commands
(``generate``, ``bench``, ``worker``) start themselves again once with ``LD_PRELOAD``
naming tcmalloc, when it is installed (Debian: libtcmalloc-minimal4, which
``scripts/setup.sh`` installs) and not loaded yet. ``INFLIGHT_ALLOCATOR=system`` keeps
glibc's. The restarted process puts ``LD_PRELOAD`` back as it was, so the processes it
starts (kernel builds, the vLLM peer, helpers) inherit nothing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ALLOCATOR_ENV = "INFLIGHT_ALLOCATOR"  # "tcmalloc" (the default) or "system"
PRELOADED_ENV = "INFLIGHT_PRELOADED_ALLOCATOR"  # set in the restarted process
PREVIOUS_PRELOAD_ENV = "INFLIGHT_PREVIOUS_LD_PRELOAD"  # LD_PRELOAD before the restart
TCMALLOC_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                "/usr/lib", "/usr/local/lib")
# tcmalloc reports every allocation over 1 GiB on stderr by default; a large KV pool or
# checkpoint is expected, not news.
QUIET_LARGE_ALLOCATIONS = {"TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": str(1 << 40)}


def find_tcmalloc(dirs: Sequence[str] = LIBRARY_DIRS) -> str | None:
    """The path of an installed tcmalloc shared library, or None."""
    for directory in dirs:
        for name in TCMALLOC_NAMES:
            path = Path(directory) / name
            if path.is_file():
                return str(path)
    return None


def restart_environment(environ: Mapping[str, str], library: str | None) -> dict[str, str] | None:
    """The environment to start this command again with ``library`` preloaded, or None when
    no restart is wanted: the user chose ``system``, nothing is installed, it is already
    preloaded, or this process is the restarted one."""
    choice = environ.get(ALLOCATOR_ENV, "tcmalloc").strip().lower()
    if choice not in ("tcmalloc", "system"):
        raise ValueError(f"{ALLOCATOR_ENV}={choice!r}: expected 'tcmalloc' or 'system'")
    preload = environ.get("LD_PRELOAD", "")
    if (choice == "system" or library is None or PRELOADED_ENV in environ
            or "tcmalloc" in preload or "jemalloc" in preload):
        return None
    env = {**QUIET_LARGE_ALLOCATIONS, **environ}
    env["LD_PRELOAD"] = f"{library}:{preload}" if preload else library
    env[PRELOADED_ENV] = library
    env[PREVIOUS_PRELOAD_ENV] = preload
    return env


def restart_with_tcmalloc() -> None:
    """Start this process's own command line again (``sys.orig_argv``: the interpreter, its
    options, the script or module and the arguments) with tcmalloc preloaded, when
    :func:`restart_environment` asks for it; otherwise return. In the restarted process,
    put ``LD_PRELOAD`` back as it was before the restart."""
    if os.environ.pop(PRELOADED_ENV, None) is not None:
        previous = os.environ.pop(PREVIOUS_PRELOAD_ENV, "")
        if previous:
            os.environ["LD_PRELOAD"] = previous
        else:
            os.environ.pop("LD_PRELOAD", None)
        return
    env = restart_environment(os.environ, find_tcmalloc())
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, sys.orig_argv, env)
    except OSError as exc:  # the interpreter cannot be started again: go on with glibc's
        print(f"inflight: not restarting on tcmalloc ({exc}); running on the system allocator",
              file=sys.stderr)


def release_free_memory() -> str | None:
    """Hand the memory this process has freed back to the system: tcmalloc keeps freed
    pages for reuse (and glibc's malloc the top of its heap), so a process that dropped a
    model still looks that large to the next one to start (vLLM sizes its KV cache by what
    it finds free). Returns the call made, or None where neither allocator answers."""
    import ctypes

    process = ctypes.CDLL(None)  # the symbols already loaded: a preloaded tcmalloc first
    for name in ("MallocExtension_ReleaseFreeMemory", "malloc_trim"):
        function = getattr(process, name, None)
        if function is None:
            continue
        if name == "malloc_trim":
            function(ctypes.c_size_t(0))
        else:
            function()
        return name
    return None
