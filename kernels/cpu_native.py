"""The native CPU backend: a C++ paged-attention kernel built on first use.

``kernels/csrc/paged_attention_cpu.cpp`` reads K/V blocks in place through the block table
(the pure-torch reference gathers them into copies first). It handles ragged query chunks
over a cached prefix: all of decode, and prefill steps whose chunks are short (longer chunks go
to :func:`kernels.reference.prefill_attention`). Both paths take the sliding ``window`` and the
logit ``softcap`` of the backend interface: the kernel starts each sequence's block walk at
the first block inside the window (blocks before it, and their table entries, are never
read, and work follows the keys in the window) and soft-caps the scores with a vector tanh;
the reference slices the keys to the window the same way. It is compiled once
with ``torch.utils.cpp_extension`` (g++ and ninja; the build is cached under
``TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``) and runs on torch's
intra-op thread pool. KV writes are one native call per layer (``write_kv``: a copy of each
token's K and V rows to its slot), in place of the reference's masking and two
``index_copy_`` calls.

The kernel is built once per instruction set: ``avx512`` (16-float vectors) or ``avx2``
(8-float vectors), chosen at run time from the CPU's capability as torch reports it, so a
cache built on one machine is never loaded on a machine that lacks its instructions and an
AVX2-only machine gets a kernel made for it. The widest build the CPU runs is the default
(see :func:`default_isa`); ``INFLIGHT_CPU_ISA=avx2`` chooses the AVX2 build on an AVX-512
machine (the tests run both).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch

from kernels import reference
from kernels.attention_backend import AttentionBackend

CSRC = Path(__file__).parent / "csrc"
SOURCE = CSRC / "paged_attention_cpu.cpp"
EXTENSION_NAME = "inflight_paged_attention_cpu"
SHORT_CHUNK = 32  # longest query chunk the native kernel takes in prefill_attention
ISA_FLAGS = {  # compiler flags of each build; the source picks its vector width from them
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma", "-mf16c"],
}
ISA_ENV = "INFLIGHT_CPU_ISA"
logger = logging.getLogger(__name__)


def env_choice(name: str, choices: tuple[str, ...]) -> str:
    """The value of environment variable ``name`` (case and surrounding spaces ignored),
    ``choices[0]`` when it is unset; a value outside ``choices`` raises ``ValueError``."""
    choice = os.environ.get(name, choices[0]).strip().lower()
    if choice not in choices:
        raise ValueError(f"{name}={choice!r}: expected one of {', '.join(choices)}")
    return choice


def supported_isas() -> list[str]:
    """The kernel builds this CPU can run, widest first (torch's own CPU capability check)."""
    capability = torch.backends.cpu.get_cpu_capability().upper()
    if capability.startswith("AVX512"):
        return ["avx512", "avx2"]
    if capability == "AVX2":
        return ["avx2"]
    return []


def default_isa() -> str:
    """The build to use: ``INFLIGHT_CPU_ISA`` when set, else the widest this CPU runs.

    On a quiet 2-core AMD EPYC (AVX-512) the AVX-512 build of decode attention took 2.3-2.5
    ms per layer against 2.6-2.7 for the AVX2 build (64 sequences x 300 tokens) and 4.95
    against 5.52 (256 x 150), same process (``benchmarks/attention_isa.py``). An earlier
    reading of 286 against 38 ms was taken with the two cores oversubscribed by other jobs
    and was not reproduced.
    """
    isas = supported_isas()
    wanted = os.environ.get(ISA_ENV, "").strip().lower()
    if wanted:
        if wanted not in ISA_FLAGS:
            raise ValueError(f"{ISA_ENV}={wanted!r}: expected one of {sorted(ISA_FLAGS)}")
        if wanted not in isas:
            raise RuntimeError(f"{ISA_ENV}={wanted!r}: this CPU supports only {isas or 'neither'}")
        return wanted
    if not isas:
        raise RuntimeError("the native CPU kernel needs AVX2 or AVX-512; this CPU has neither")
    return isas[0]


def load_extension(isa: str | None = None) -> ModuleType:
    """The attention extension built for ``isa`` (default: :func:`default_isa`), compiled
    on the first call on a machine; raises if it cannot build."""
    return build(EXTENSION_NAME, SOURCE.name, isa or default_isa())


def sources_digest() -> str:
    """A digest of every file under ``csrc/``: torch's build cache tracks the sources it is
    given but not the headers they include, so the digest goes into each build's name."""
    digest = hashlib.sha256()
    for path in sorted(CSRC.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:10]


def build_directory(full_name: str) -> Path:
    """Where the build of ``full_name`` lives: ``$TORCH_EXTENSIONS_DIR/inflight/<name>``
    (default root ``~/.cache/torch_extensions``), one folder per Python version."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or str(Path.home() / ".cache" / "torch_extensions")
    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    return Path(root) / "inflight" / python / full_name


@contextlib.contextmanager
def exclusive_build(directory: Path) -> Iterator[None]:
    """Hold the build of ``directory`` alone, clearing a lock a killed build left behind.

    torch marks a build in progress with a ``lock`` file and waits, without end, while it
    exists; a build killed half-way (a stopped test run, a killed worker) leaves it, and every
    later start would hang. An ``flock`` is released by the kernel when its holder dies, so
    while we hold it no other build of ours runs here and a ``lock`` file can only be stale.
    """
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "inflight-build.flock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            stale = directory / "lock"
            if stale.exists():
                logger.warning("removing the stale build lock %s left by a killed build", stale)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@functools.cache
def build(name: str, source: str, isa: str, extra_cflags: tuple[str, ...] = ()) -> ModuleType:
    """Compile (or load the cached build of) ``csrc/<source>`` for ``isa`` as ``name``."""
    from torch.utils.cpp_extension import load

    if shutil.which("ninja") is None:  # the pip `ninja` wheel puts it next to the interpreter
        os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    full_name = f"{name}_{isa}_{sources_digest()}"
    if extra_cflags:  # a build with other macros is another build
        full_name += "_" + hashlib.sha256("\0".join(extra_cflags).encode()).hexdigest()[:8]
    directory = build_directory(full_name)
    with exclusive_build(directory):
        return load(
            name=full_name,
            sources=[str(CSRC / source)],
            extra_cflags=["-O3", *ISA_FLAGS[isa], "-fopenmp", *extra_cflags],
            extra_ldflags=["-fopenmp"],
            build_directory=str(directory),
            verbose=False,
        )


def decode_attention(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq]
    context_lens: torch.Tensor,  # [num_seqs], includes the query token itself
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
    *,
    ext: ModuleType | None = None,  # the build to run (default: load_extension())
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """One query per sequence over its context, or its last ``window`` keys when
    ``window > 0``, scores soft-capped when ``softcap > 0`` (see
    kernels.reference.decode_attention)."""
    reference.check_options(window, softcap)
    num_seqs = query.shape[0]
    cu_seqlens_q = torch.arange(num_seqs + 1, dtype=torch.int64)  # [num_seqs + 1], one query each
    return (ext or load_extension()).paged_attention(
        query, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, float(scale),
        int(window), float(softcap),
    )  # fmt: skip


def prefill_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq]
    cu_seqlens_q: torch.Tensor,  # [num_seqs + 1]
    context_lens: torch.Tensor,  # [num_seqs], cached prefix + this chunk
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
    *,
    ext: ModuleType | None = None,  # the build to run (default: load_extension())
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Ragged causal chunks over a cached prefix, each query seeing its last ``window`` keys
    when ``window > 0``, scores soft-capped when ``softcap > 0`` (see
    kernels.reference.prefill_attention).

    Short chunks (speculative drafts being checked, small prefill tails) go to the native
    kernel; once any chunk is longer than ``SHORT_CHUNK`` the step is matmul-shaped and
    per-sequence SDPA (oneDNN GEMMs) is faster: 64 prompts of 300 tokens took 29 s that
    way against 49 s through the native kernel's scalar tiles. That path (the reference)
    honours the window and soft-cap too, reading only the keys inside the window.
    """
    reference.check_options(window, softcap)
    longest = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max()) if cu_seqlens_q.numel() > 1 else 0
    if longest > SHORT_CHUNK:
        return reference.prefill_attention(
            query, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale,
            window, softcap,
        )  # fmt: skip
    return (ext or load_extension()).paged_attention(
        query, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, float(scale),
        int(window), float(softcap),
    )  # fmt: skip


def make_backend(isa: str | None = None) -> AttentionBackend:
    """The native backend bound to the build for ``isa`` (default: :func:`default_isa`),
    which is compiled here if this machine has not built it yet."""
    ext = load_extension(isa)

    def decode(query, k_cache, v_cache, block_tables, context_lens, scale, window=0, softcap=0.0):
        return decode_attention(query, k_cache, v_cache, block_tables, context_lens, scale,
                                window, softcap, ext=ext)

    def prefill(query, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale,
                window=0, softcap=0.0):
        return prefill_attention(query, k_cache, v_cache, block_tables, cu_seqlens_q,
                                 context_lens, scale, window, softcap, ext=ext)

    def write(key, value, k_cache, v_cache, slot_mapping):
        if key.dtype != k_cache.dtype or value.dtype != v_cache.dtype:
            return reference.write_kv(key, value, k_cache, v_cache, slot_mapping)  # casts
        return ext.write_kv(key, value, k_cache, v_cache, slot_mapping)

    return AttentionBackend(name="cpu", write_kv=write,
                            decode_attention=decode, prefill_attention=prefill)
