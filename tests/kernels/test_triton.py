"""The Triton kernels against kernels/reference.py: under the interpreter, or on CUDA.

By default every check runs under the Triton interpreter (TRITON_INTERPRET=1, on the
CPU). With ``INFLIGHT_TRITON_TEST_DEVICE=cuda`` the same checks, over the same grids, run
compiled on the GPU instead (benchmarks/gpu_check.py does this): in the pytest process,
with CUDA as the default device so every input, cache and output is built there.

How they run: ``tests/kernels/triton_harness.py``.

Oracle: the reference run on float32 copies of the very same (possibly bf16/fp16) inputs,
so the tolerances below measure only the kernels' own rounding. Outputs are NaN-poisoned
before each launch, and unused cache slots and the block past-the-end table entries point
to hold NaN, so an unwritten output element or a stray read fails. With a sliding window
the blocks wholly before it are NaN as well and their table entries -1, with a NaN guard
block just before the cache, so a kernel that reads one of them fails too.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import replace
from typing import Any

import pytest
import torch

from kernels import reference
from kernels.attention_backend import TORCH_BACKEND
from kernels.backend import get_backend
from tests.kernels.paged_batch import PagedBatch, cu_seqlens, make_paged_batch
from tests.kernels.triton_harness import DEVICE_ENV, Run

if importlib.util.find_spec("triton") is None:  # found, not imported: see the docstring
    pytest.skip("triton is not installed: the Triton kernels cannot run", allow_module_level=True)

# (atol, rtol) of the kernel output against the fp32 reference on the same inputs.
# fp32: both sides accumulate in fp32 (tl.dot with input_precision="ieee"); differences are
# summation order only. bf16/fp16: the probabilities are rounded to the input dtype before
# the P@V dot (as in flash attention) and the output is rounded once more; the interpreter
# rounds fp32 -> bf16 by truncation (a full ulp, the GPU rounds to nearest), so bf16 allows
# about two ulps of an output of magnitude ~1.
TOLERANCES = {
    torch.float32: (2e-5, 2e-5),
    torch.bfloat16: (2e-2, 2e-2),
    torch.float16: (3e-3, 3e-3),
}


def test_device_selection_is_known() -> None:
    """A misspelt device must not silently fall back to the interpreter."""
    assert os.environ.get(DEVICE_ENV, "interpreter") in ("interpreter", "cuda")


def poisoned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An output buffer full of NaN: any element a kernel forgets to write fails the test."""
    return torch.full(shape, float("nan"), dtype=dtype)


def guarded(
    shape: tuple[int, ...], dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """A NaN cache ``shape`` inside a buffer with one NaN guard block on each side.

    Returns ``(cache, buffer)``; a write before or after the cache (e.g. a negative slot
    that was not skipped) lands in a guard block, where the test sees it.
    """
    buffer = poisoned((shape[0] + 2, *shape[1:]), dtype)  # [num_blocks + 2, ...]
    return buffer[1:-1], buffer


def assert_matches(out: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    """``out`` (kernel, ``dtype``) is within the dtype's tolerance of ``want`` (fp32 reference)."""
    atol, rtol = TOLERANCES[dtype]
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), want.float(), atol=atol, rtol=rtol)


def fp32_caches(batch: PagedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's caches upcast to fp32 (exact), for the reference oracle."""
    return batch.k_cache.float(), batch.v_cache.float()


def ragged(block_size: int) -> list[int]:
    """Context lengths: 1, block boundary -1/exact/+1, two blocks, several blocks."""
    return [1, block_size - 1, block_size, block_size + 1, 2 * block_size, 4 * block_size + 5]


def chunk_layout(block_size: int) -> list[tuple[int, int]]:
    """(context_len, q_len): 1-token prompt, whole prompts at and past a block boundary,
    chunks over a cached prefix (one spanning two query tiles), a 1-token chunk, and chunks
    whose first row sits one before / on the 64-key tile edge (unmasked vs diagonal loop)."""
    bs = block_size
    return [
        *[(1, 1), (bs, bs), (bs + 1, bs + 1), (3 * bs, bs + 1), (4 * bs + 7, 70), (2 * bs, 1)],
        *[(72, 10), (73, 10)],  # first query at position 62 / 63 of a 64-key tile
    ]


def drop_before_window(batch: PagedBatch, q_lens: list[int], window: int) -> tuple[PagedBatch, int]:
    """A copy of ``batch`` whose blocks wholly before the window of each sequence's first
    query are NaN with table entries -1, the caches one NaN guard block into their buffer
    (where a -1 entry leads). Returns it and the number of blocks dropped. (The same as
    ``drop_blocks_before_window`` in tests/kernels/test_reference.py, which this file cannot
    import: that one needs hypothesis, GPU machines carry only torch, triton and pytest.)
    """
    if window == 0:
        return batch, 0
    block_size = batch.k_cache.shape[1]
    k_cache, _ = guarded(tuple(batch.k_cache.shape), batch.k_cache.dtype)  # [NB, bs, Hkv, D]
    v_cache, _ = guarded(tuple(batch.v_cache.shape), batch.v_cache.dtype)  # [NB, bs, Hkv, D]
    k_cache.copy_(batch.k_cache)
    v_cache.copy_(batch.v_cache)
    tables = batch.block_tables.clone()  # [num_seqs, max_blocks]
    dropped = 0
    for i, (context_len, q_len) in enumerate(zip(batch.context_lens.tolist(), q_lens, strict=True)):
        if q_len == 0:
            continue
        for b in range(max(0, context_len - q_len - window + 1) // block_size):
            k_cache[int(tables[i, b])] = float("nan")
            v_cache[int(tables[i, b])] = float("nan")
            tables[i, b] = -1
            dropped += 1
    return replace(batch, k_cache=k_cache, v_cache=v_cache, block_tables=tables), dropped


# --- checks, run in the interpreter worker ----------------------------------------------


def check_write_kv(
    src_dtype: torch.dtype, cache_dtype: torch.dtype, block_size: int, head_dim: int
) -> None:
    """write_kv vs reference: boundary slots, negative slots skipped, 3 heads (tile of 4)."""
    from kernels.triton_write_kv import write_kv

    num_blocks, num_kv_heads = 5, 3
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    last = num_blocks * block_size - 1
    slots = torch.tensor([0, -1, block_size - 1, block_size, last, -7, 2 * block_size + 3])
    key = torch.randn(len(slots), num_kv_heads, head_dim).to(src_dtype)
    value = torch.randn(len(slots), num_kv_heads, head_dim).to(src_dtype)
    (k_cache, k_buf), (v_cache, v_buf) = guarded(shape, cache_dtype), guarded(shape, cache_dtype)
    (k_want, k_want_buf), (v_want, v_want_buf) = (
        guarded(shape, cache_dtype),
        guarded(shape, cache_dtype),
    )
    write_kv(key, value, k_cache, v_cache, slots)
    reference.write_kv(key, value, k_want, v_want, slots)
    # A copy, exact when no cast is involved. Casting fp32 -> bf16, Triton 3.9's interpreter
    # truncates where torch (and Triton on the GPU) rounds to nearest: allow one bf16 ulp.
    rtol = 0.0 if src_dtype == cache_dtype else 2**-7
    # NaN where nothing was written (guard blocks included), on both sides.
    torch.testing.assert_close(k_buf, k_want_buf, atol=0, rtol=rtol, equal_nan=True)
    torch.testing.assert_close(v_buf, v_want_buf, atol=0, rtol=rtol, equal_nan=True)
    written = torch.isnan(k_cache).logical_not().any(dim=3).any(dim=2).sum()  # slots touched
    assert int(written) == 5


def check_write_kv_from_fused_qkv() -> None:
    """Strided K/V views (slices of one QKV projection) and int32 slots."""
    from kernels.triton_write_kv import write_kv

    tokens, num_heads, num_kv_heads, head_dim = 6, 4, 2, 64
    qkv = torch.randn(tokens, (num_heads + 2 * num_kv_heads) * head_dim)
    q_end, k_end = num_heads * head_dim, (num_heads + num_kv_heads) * head_dim
    key = qkv[:, q_end:k_end].view(tokens, num_kv_heads, head_dim)  # strides (W, D, 1)
    value = qkv[:, k_end:].view(tokens, num_kv_heads, head_dim)  # strides (W, D, 1)
    slots = torch.tensor([3, 9, -1, 31, 16, 0], dtype=torch.int32)
    shape = (2, 16, num_kv_heads, head_dim)
    (k_cache, k_buf), (v_cache, v_buf) = guarded(shape), guarded(shape)
    (k_want, k_want_buf), (v_want, v_want_buf) = guarded(shape), guarded(shape)
    write_kv(key, value, k_cache, v_cache, slots)
    reference.write_kv(key, value, k_want, v_want, slots)
    torch.testing.assert_close(k_buf, k_want_buf, atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(v_buf, v_want_buf, atol=0, rtol=0, equal_nan=True)


def check_decode(
    lens: list[int],
    block_size: int,
    head_dim: int,
    group: int,
    dtype: torch.dtype = torch.float32,
    num_kv_heads: int = 2,
    partition_size: int | None = None,
    seed: int = 0,
) -> None:
    """Decode kernel vs reference for one ragged batch."""
    from kernels.triton_decode_attention import decode_attention

    torch.manual_seed(seed)
    batch = make_paged_batch(lens, block_size, num_kv_heads, head_dim, dtype=dtype, seed=seed)
    query = (2 * torch.randn(len(lens), num_kv_heads * group, head_dim)).to(dtype)
    scale = head_dim**-0.5
    out = poisoned(tuple(query.shape), dtype)
    got = decode_attention(
        query, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, scale,
        partition_size=partition_size, out=out,
    )  # fmt: skip
    assert got is out
    k32, v32 = fp32_caches(batch)
    want = reference.decode_attention(
        query.float(), k32, v32, batch.block_tables, batch.context_lens, scale
    )
    assert_matches(out, want, dtype)


def check_decode_window(
    lens: list[int],
    block_size: int,
    window: int,
    softcap: float,
    partition_size: int | None = None,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> None:
    """Decode with a sliding window and/or soft-cap vs the reference, GQA 8 heads on 2, with
    NaN blocks and -1 table entries before each sequence's window."""
    from kernels.triton_decode_attention import decode_attention

    num_kv_heads, head_dim = 2, 64
    torch.manual_seed(seed)
    batch = make_paged_batch(lens, block_size, num_kv_heads, head_dim, dtype=dtype, seed=seed)
    dropped, count = drop_before_window(batch, [1] * len(lens), window)
    assert count > 0 or window == 0 or window >= max(lens) - block_size
    query = (3 * torch.randn(len(lens), 8, head_dim)).to(dtype)  # scores reach tens
    scale = head_dim**-0.5
    out = poisoned(tuple(query.shape), dtype)
    decode_attention(
        query, dropped.k_cache, dropped.v_cache, dropped.block_tables, dropped.context_lens,
        scale, window, softcap, partition_size=partition_size, out=out,
    )  # fmt: skip
    k32, v32 = fp32_caches(batch)
    want = reference.decode_attention(
        query.float(), k32, v32, batch.block_tables, batch.context_lens, scale, window, softcap
    )
    assert_matches(out, want, dtype)


def check_decode_odd_head_dim() -> None:
    """head_dim 80 (tile padded to 128), int32 tables, a strided query view."""
    from kernels.triton_decode_attention import decode_attention

    batch = make_paged_batch([5, 33, 64], 16, 2, 80, seed=5, index_dtype=torch.int32)
    qkv = torch.randn(3, 8 * 80)
    query = qkv[:, : 4 * 80].view(3, 4, 80)  # strides (640, 80, 1)
    out = poisoned((3, 4, 80), torch.float32)
    args = (batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, 0.1)
    decode_attention(query, *args, partition_size=64, out=out)
    assert_matches(out, reference.decode_attention(query, *args), torch.float32)


def check_prefill(
    layout: list[tuple[int, int]],  # (context_len, q_len) per sequence
    block_size: int,
    head_dim: int,
    group: int,
    dtype: torch.dtype = torch.float32,
    num_kv_heads: int = 2,
    seed: int = 0,
) -> None:
    """Prefill kernel vs reference for one ragged batch of chunks over cached prefixes."""
    from kernels.triton_prefill_attention import prefill_attention

    torch.manual_seed(seed)
    contexts = [c for c, _ in layout]
    q_lens = [q for _, q in layout]
    batch = make_paged_batch(contexts, block_size, num_kv_heads, head_dim, dtype=dtype, seed=seed)
    query = (2 * torch.randn(sum(q_lens), num_kv_heads * group, head_dim)).to(dtype)
    cu = cu_seqlens(q_lens)
    scale = head_dim**-0.5
    out = poisoned(tuple(query.shape), dtype)
    got = prefill_attention(
        query, batch.k_cache, batch.v_cache, batch.block_tables, cu, batch.context_lens, scale,
        out=out,
    )  # fmt: skip
    assert got is out
    k32, v32 = fp32_caches(batch)
    want = reference.prefill_attention(
        query.float(), k32, v32, batch.block_tables, cu, batch.context_lens, scale
    )
    assert_matches(out, want, dtype)


def check_prefill_window(
    layout: list[tuple[int, int]],  # (context_len, q_len) per sequence
    block_size: int,
    window: int,
    softcap: float,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> None:
    """Prefill with a sliding window and/or soft-cap vs the reference, GQA 8 heads on 2,
    with NaN blocks and -1 table entries before each chunk's first window."""
    from kernels.triton_prefill_attention import prefill_attention

    num_kv_heads, head_dim = 2, 64
    torch.manual_seed(seed)
    contexts = [c for c, _ in layout]
    q_lens = [q for _, q in layout]
    batch = make_paged_batch(contexts, block_size, num_kv_heads, head_dim, dtype=dtype, seed=seed)
    dropped, _ = drop_before_window(batch, q_lens, window)
    query = (3 * torch.randn(sum(q_lens), 8, head_dim)).to(dtype)  # scores reach tens
    cu = cu_seqlens(q_lens)
    scale = head_dim**-0.5
    out = poisoned(tuple(query.shape), dtype)
    prefill_attention(
        query, dropped.k_cache, dropped.v_cache, dropped.block_tables, cu, dropped.context_lens,
        scale, window, softcap, out=out,
    )  # fmt: skip
    k32, v32 = fp32_caches(batch)
    want = reference.prefill_attention(
        query.float(), k32, v32, batch.block_tables, cu, batch.context_lens, scale, window, softcap
    )
    assert_matches(out, want, dtype)


def check_window_partitions() -> None:
    """With a window, the decode grid is sized by the window, not by the block table."""
    from kernels import triton_decode_attention as tda

    launched = []

    class Spy:
        """Records the grid of one kernel launch, then runs it."""

        def __init__(self, kernel: Any) -> None:
            self.kernel = kernel

        def __getitem__(self, grid: tuple[int, ...]) -> Any:
            launched.append(grid)
            return self.kernel[grid]

    batch = make_paged_batch([4000, 3000], 16, 1, 16, seed=2)
    query = torch.randn(2, 2, 16)
    args = (query, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, 0.25)
    original = tda._decode_kernel
    tda._decode_kernel = Spy(original)
    try:
        tda.decode_attention(*args, partition_size=64)
        tda.decode_attention(*args, 100, partition_size=64)
    finally:
        tda._decode_kernel = original
    assert launched[0][2] == triton_cdiv(batch.block_tables.shape[1] * 16, 64)
    assert launched[1][2] == 2  # 100 keys in partitions of 64


def triton_cdiv(a: int, b: int) -> int:
    """Ceil division (a local copy: this module must not import triton itself)."""
    return -(-a // b)


def check_prefill_odd_head_dim() -> None:
    """head_dim 80, int32 cu_seqlens/tables/context lengths, 3 query heads on 1 KV head."""
    from kernels.triton_prefill_attention import prefill_attention

    batch = make_paged_batch([20, 40], 16, 1, 80, seed=4, index_dtype=torch.int32)
    query = torch.randn(23, 3, 80)
    cu = cu_seqlens([20, 3]).to(torch.int32)
    out = poisoned((23, 3, 80), torch.float32)
    args = (batch.k_cache, batch.v_cache, batch.block_tables, cu, batch.context_lens, 0.1)
    prefill_attention(query, *args, out=out)
    assert_matches(out, reference.prefill_attention(query, *args), torch.float32)


def check_backend_pipeline() -> None:
    """Through get_backend: write_kv + prefill of two prompts, then write_kv + decode."""
    from kernels.triton_backend import TRITON_BACKEND

    backend = get_backend(torch.get_default_device(), prefer="triton")
    assert backend is TRITON_BACKEND and backend.name == "triton"
    block_size, num_kv_heads, num_heads, head_dim = 16, 2, 4, 64
    shape = (6, block_size, num_kv_heads, head_dim)
    tables = torch.tensor([[4, 1, 0], [2, 5, 3]])
    prompts = [20, 33]
    steps = [(prompts, prompts), ([n + 1 for n in prompts], [1, 1])]  # (context, q_lens)
    results = []
    for impl in (backend, TORCH_BACKEND):
        gen = torch.Generator(device=torch.get_default_device()).manual_seed(0)
        k_cache, v_cache = poisoned(shape, torch.float32), poisoned(shape, torch.float32)
        outs = []
        for lens, q_lens in steps:
            pos = [torch.arange(n - q, n) for n, q in zip(lens, q_lens, strict=True)]
            slots = torch.cat(
                [
                    tables[i, p // block_size] * block_size + p % block_size
                    for i, p in enumerate(pos)
                ]
            )  # [num_tokens]
            q = torch.randn(len(slots), num_heads, head_dim, generator=gen)
            k = torch.randn(len(slots), num_kv_heads, head_dim, generator=gen)
            v = torch.randn(len(slots), num_kv_heads, head_dim, generator=gen)
            impl.write_kv(k, v, k_cache, v_cache, slots)
            context = torch.tensor(lens)
            if q_lens == [1, 1]:
                outs.append(impl.decode_attention(q, k_cache, v_cache, tables, context, 0.125))
            else:
                cu = cu_seqlens(q_lens)
                outs.append(impl.prefill_attention(q, k_cache, v_cache, tables, cu, context, 0.125))
        results.append(outs)
    for got, want in zip(results[0], results[1], strict=True):
        assert_matches(got, want, torch.float32)


def check_bad_arguments() -> None:
    """Each wrapper raises a ValueError naming the problem, before any launch."""
    from kernels.triton_decode_attention import decode_attention as decode
    from kernels.triton_prefill_attention import prefill_attention
    from kernels.triton_write_kv import write_kv

    batch = make_paged_batch([5, 17], 16, 2, 64)
    kc, vc, bt, lens = batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens
    q = torch.randn(2, 4, 64)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        decode(torch.randn(2, 3, 64), kc, vc, bt, lens, 1.0)
    with pytest.raises(ValueError, match="head_dim"):
        decode(torch.randn(2, 4, 32), kc, vc, bt, lens, 1.0)
    with pytest.raises(ValueError, match="dtype"):
        decode(q.half(), kc, vc, bt, lens, 1.0)
    with pytest.raises(ValueError, match="contiguous in its last dimension"):
        decode(torch.randn(2, 4, 128)[:, :, ::2], kc, vc, bt, lens, 1.0)
    with pytest.raises(ValueError, match="context_lens must be int32 or int64"):
        decode(q, kc, vc, bt, lens.float(), 1.0)
    with pytest.raises(ValueError, match="context_lens must have shape"):
        decode(q, kc, vc, bt, lens[:1], 1.0)
    with pytest.raises(ValueError, match="block_tables rows must be contiguous"):
        decode(q, kc, vc, bt.t().contiguous().t(), lens, 1.0)
    with pytest.raises(ValueError, match="partition_size"):
        decode(q, kc, vc, bt, lens, 1.0, partition_size=100)
    with pytest.raises(ValueError, match="out must be"):
        decode(q, kc, vc, bt, lens, 1.0, out=torch.empty(2, 4, 64, dtype=torch.float16))
    with pytest.raises(ValueError, match="must match"):
        decode(q, kc, vc.half(), bt, lens, 1.0)
    with pytest.raises(ValueError, match="cu_seqlens_q must have shape"):
        prefill_attention(q, kc, vc, bt, torch.tensor([0, 1]), lens, 1.0)
    with pytest.raises(ValueError, match="slot_mapping must be int32 or int64"):
        write_kv(q[:, :2], q[:, :2], kc, vc, torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="slot_mapping must be"):
        write_kv(q[:, :2], q[:, :2], kc, vc, torch.tensor([0]))
    with pytest.raises(ValueError, match="cache holds"):
        write_kv(q, q, kc, vc, torch.tensor([0, 1]))


def check_partition_choice() -> None:
    """Split until the batch fills the device (128 programs off CUDA), then stop."""
    from kernels.triton_decode_attention import (
        MAX_SPLITS,
        MIN_PARTITION,
        choose_partition_size,
    )

    cpu = torch.device("cpu")
    small = choose_partition_size(1, 8, 8192, cpu)
    assert small == 512 and 8 * (8192 // small) == 128  # a lone sequence fills the target
    assert choose_partition_size(256, 8, 8192, cpu) >= 8192  # a big batch does: no split
    assert 1_000_000 / choose_partition_size(1, 1, 1_000_000, cpu) <= MAX_SPLITS
    assert choose_partition_size(1, 1, 100, cpu) == MIN_PARTITION
    # The long-context test below relies on the default splitting a 2,100-token context.
    assert choose_partition_size(3, 1, 2128, cpu) < 2100


# --- tests ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("src_dtype", "cache_dtype"),
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float16),
        (torch.float32, torch.bfloat16),
    ],
)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_write_kv(
    run: Run, src_dtype: torch.dtype, cache_dtype: torch.dtype, block_size: int, head_dim: int
) -> None:
    run(check_write_kv, src_dtype, cache_dtype, block_size, head_dim)


def test_write_kv_from_fused_qkv_int32_slots(run: Run) -> None:
    run(check_write_kv_from_fused_qkv)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 4])
def test_decode_fp32_grid(run: Run, block_size: int, head_dim: int, group: int) -> None:
    lens, seed = ragged(block_size), block_size + head_dim + group
    run(check_decode, lens, block_size, head_dim, group, seed=seed)  # one partition
    run(check_decode, lens, block_size, head_dim, group, partition_size=64, seed=seed)  # split-K


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group", [1, 4])
def test_decode_half_dtypes(run: Run, dtype: torch.dtype, group: int) -> None:
    run(check_decode, ragged(16), 16, 128, group, dtype=dtype, seed=group)
    run(check_decode, ragged(16), 16, 128, group, dtype=dtype, partition_size=64, seed=group)


def test_decode_partition_choice(run: Run) -> None:
    run(check_partition_choice)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_long_context_default_split(run: Run, dtype: torch.dtype) -> None:
    """Contexts of 2,048+ tokens next to a 1-token one; the default partitioning splits."""
    run(check_decode, [2100, 1, 2048], 16, 64, 4, dtype=dtype, num_kv_heads=1, seed=11)


def test_decode_odd_head_dim_int32_indices(run: Run) -> None:
    run(check_decode_odd_head_dim)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 4])
def test_prefill_fp32_grid(run: Run, block_size: int, head_dim: int, group: int) -> None:
    seed = block_size * head_dim + group
    num_kv_heads = 2 if head_dim == 64 else 1  # two KV heads once per GQA ratio: time
    layout = chunk_layout(block_size)
    run(check_prefill, layout, block_size, head_dim, group, num_kv_heads=num_kv_heads, seed=seed)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_prefill_half_dtypes(run: Run, dtype: torch.dtype) -> None:
    run(check_prefill, chunk_layout(16), 16, 128, 3, dtype=dtype, num_kv_heads=1, seed=3)


def test_prefill_long_context(run: Run) -> None:
    """A chunk after a 2,000-token cached prefix, a whole 200-token prompt, an empty chunk."""
    run(check_prefill, [(2100, 100), (200, 200), (50, 0)], 32, 64, 2, num_kv_heads=1, seed=9)


def test_prefill_odd_head_dim_int32_indices(run: Run) -> None:
    run(check_prefill_odd_head_dim)


def test_head_dim_16_of_the_tiny_models(run: Run) -> None:
    """head_dim 16 (tiny-llama, tiny-qwen2): the smallest tile ``tl.dot`` accepts."""
    run(check_write_kv, torch.float32, torch.float32, 16, 16)
    run(check_decode, ragged(16), 16, 16, 2, seed=1)
    run(check_decode, ragged(16), 16, 16, 2, partition_size=64, seed=1)
    run(check_prefill, chunk_layout(16), 16, 16, 2, num_kv_heads=2, seed=2)


def test_triton_backend_matches_torch_backend(run: Run) -> None:
    run(check_backend_pipeline)


def test_wrappers_reject_bad_arguments(run: Run) -> None:
    run(check_bad_arguments)


# --- sliding window and soft-capping ------------------------------------------------------

WINDOWS = [1, 7, 16, 33, 200, 4096]  # 0 is every test above; 200 leaves unmasked tiles inside
SOFTCAPS = [0.0, 50.0]


def window_layout(block_size: int) -> list[tuple[int, int]]:
    """(context_len, q_len): chunk_layout's cases (with a 70-query chunk that fits a block
    size of 12 too), plus a chunk of two query tiles after a 500-token prefix whose tiles
    see the window's masked lower edge, unmasked tiles and the diagonal."""
    bs = block_size
    return [
        *[(1, 1), (bs, bs), (bs + 1, bs + 1), (3 * bs, bs + 1), (80, 70), (2 * bs, 1)],
        *[(72, 10), (73, 10), (600, 100)],
    ]


@pytest.mark.parametrize("block_size", [16, 12])
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("softcap", SOFTCAPS)
def test_decode_window_softcap(run: Run, block_size: int, window: int, softcap: float) -> None:
    lens = [*ragged(block_size), 300]
    seed = window + block_size
    run(check_decode_window, lens, block_size, window, softcap, seed=seed)  # one partition
    run(check_decode_window, lens, block_size, window, softcap, partition_size=64, seed=seed)


def test_decode_softcap_without_window(run: Run) -> None:
    run(check_decode_window, [*ragged(16), 300], 16, 0, 50.0, partition_size=64, seed=3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_decode_window_half_dtypes(run: Run, dtype: torch.dtype) -> None:
    run(check_decode_window, [*ragged(16), 300], 16, 33, 50.0, partition_size=64, dtype=dtype)


def test_decode_grid_follows_the_window(run: Run) -> None:
    run(check_window_partitions)


@pytest.mark.parametrize("block_size", [16, 12])
@pytest.mark.parametrize("window", [0, *WINDOWS])
@pytest.mark.parametrize("softcap", SOFTCAPS)
def test_prefill_window_softcap(run: Run, block_size: int, window: int, softcap: float) -> None:
    run(check_prefill_window, window_layout(block_size), block_size, window, softcap, seed=window)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_prefill_window_half_dtypes(run: Run, dtype: torch.dtype) -> None:
    run(check_prefill_window, window_layout(16), 16, 33, 50.0, dtype=dtype, seed=1)


@pytest.mark.parametrize("window", [0, 33])
def test_a_tight_softcap_uses_both_forms_of_tanh(run: Run, window: int) -> None:
    """Soft-cap 5: scores / 5 lie on both sides of 0.625, where the kernels' tanh
    (kernels.triton_common.tanh) switches from its polynomial to its exponential form."""
    run(check_decode_window, [*ragged(16), 300], 16, window, 5.0, partition_size=64, seed=5)
    run(check_prefill_window, window_layout(16), 16, window, 5.0, seed=5)
