"""The native C++ CPU paged-attention kernel against the pure-torch reference and float64.

The paged batches come from tests/kernels/test_reference.py: shuffled blocks, NaN in every
unused slot and past-the-end table entry, so a read outside a sequence's context fails;
with a sliding window, the blocks wholly before it are NaN too and their table entries -1.
The extension is built on first use (g++ and ninja); a machine that cannot build it fails
here rather than silently testing the fallback.
"""

from __future__ import annotations

import pytest
import torch

from kernels import cpu_native, get_backend, reference
from tests.kernels.test_reference import (
    RAGGED,
    SOFTCAPS,
    WINDOW_CONTEXTS,
    WINDOWS,
    cu_seqlens,
    drop_blocks_before_window,
    make_paged_batch,
    naive_attention,
    scores_query,
)

ISAS = cpu_native.supported_isas()


@pytest.fixture(autouse=True, params=ISAS or ["none"])
def isa(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs once per kernel build this CPU can execute (AVX-512 and AVX2 here)."""
    if request.param == "none":
        pytest.fail("this CPU has neither AVX2 nor AVX-512: the native kernel cannot run")
    monkeypatch.setenv(cpu_native.ISA_ENV, request.param)
    cpu_native.load_extension()
    return request.param


@pytest.mark.parametrize("block_size", [16, 32, 12, 24])  # 12 and 24: not whole vectors
@pytest.mark.parametrize(("num_kv_heads", "group"), [(1, 1), (2, 3), (3, 3), (2, 4)])
@pytest.mark.parametrize("head_dim", [64, 128, 48])  # register-blocked 64 and 128, scalar 48
def test_decode_matches_reference_and_float64(
    block_size: int, num_kv_heads: int, group: int, head_dim: int
) -> None:
    batch = make_paged_batch(RAGGED, block_size, num_kv_heads, head_dim, seed=block_size + group)
    query = torch.randn(len(RAGGED), num_kv_heads * group, head_dim)
    args = (query, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, 0.125)
    out = cpu_native.decode_attention(*args)
    assert out.shape == query.shape and not torch.isnan(out).any()
    torch.testing.assert_close(out, reference.decode_attention(*args), atol=2e-6, rtol=2e-5)
    for i in range(len(RAGGED)):
        want = naive_attention(query[i : i + 1], batch.keys[i], batch.values[i], 0.125)
        torch.testing.assert_close(out[i : i + 1].double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("head_dim", [64, 32])
def test_ragged_chunks_over_cached_prefix(block_size: int, group: int, head_dim: int) -> None:
    # (context_len, q_len): whole prompts, chunks over a prefix, 1-token and empty chunks,
    # a chunk longer than the kernel's 8-query tile and one ending on a block boundary.
    layout = [(1, 1), (16, 16), (33, 33), (40, 7), (64, 32), (33, 1), (20, 0), (90, 19)]
    contexts = [c for c, _ in layout]
    q_lens = [q for _, q in layout]
    num_kv_heads = 2
    batch = make_paged_batch(contexts, block_size, num_kv_heads, head_dim, seed=block_size * group)
    query = torch.randn(sum(q_lens), num_kv_heads * group, head_dim)
    cu = cu_seqlens(q_lens)
    args = (query, batch.k_cache, batch.v_cache, batch.block_tables, cu, batch.context_lens, 0.3)
    out = cpu_native.load_extension().paged_attention(*args)
    # through the backend function: short chunks native, a longer one via the reference
    # two fp32 summation orders (SDPA vs the kernel): the float64 tolerance used below
    torch.testing.assert_close(cpu_native.prefill_attention(*args), out, atol=1e-5, rtol=1e-5)
    for i in range(len(layout)):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        want = naive_attention(query[rows], batch.keys[i], batch.values[i], 0.3)
        torch.testing.assert_close(out[rows].double(), want, atol=1e-5, rtol=1e-5)


def test_bf16_cache_accumulates_in_float32() -> None:
    batch = make_paged_batch(RAGGED, 16, 2, 64, dtype=torch.bfloat16, seed=11)
    query = torch.randn(len(RAGGED), 6, 64).to(torch.bfloat16)
    out = cpu_native.decode_attention(
        query, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, 0.125
    )
    assert out.dtype == torch.bfloat16
    for i in range(len(RAGGED)):
        want = naive_attention(query[i : i + 1], batch.keys[i], batch.values[i], 0.125)
        torch.testing.assert_close(out[i : i + 1].double(), want, atol=1e-2, rtol=1e-2)


def test_int32_tables_and_one_thread_give_the_same_result() -> None:
    batch = make_paged_batch([3, 47, 200], 16, 3, 64, seed=5, index_dtype=torch.int32)
    query = torch.randn(3, 9, 64)
    args = (query, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, 0.125)
    many = cpu_native.decode_attention(*args)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = cpu_native.decode_attention(*args)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(many, one)  # work items are independent: no thread-order effects


def test_bad_shapes_are_refused() -> None:
    batch = make_paged_batch([40], 16, 2, 32, seed=1)
    ext = cpu_native.load_extension()
    with pytest.raises(RuntimeError, match="more queries than context"):
        ext.paged_attention(torch.randn(41, 2, 32), batch.k_cache, batch.v_cache,
                            batch.block_tables, cu_seqlens([41]), batch.context_lens, 1.0)
    with pytest.raises(RuntimeError, match="one entry more than context_lens"):
        ext.paged_attention(torch.randn(1, 2, 32), batch.k_cache, batch.v_cache,
                            batch.block_tables, cu_seqlens([1, 0]), batch.context_lens, 1.0)
    with pytest.raises(RuntimeError, match="past the queries"):
        ext.paged_attention(torch.randn(3, 2, 32), batch.k_cache, batch.v_cache,
                            batch.block_tables, cu_seqlens([5]), batch.context_lens, 1.0)
    with pytest.raises(RuntimeError, match="differ in shape"):
        ext.paged_attention(torch.randn(1, 2, 32), batch.k_cache, batch.v_cache[:-1],
                            batch.block_tables, cu_seqlens([1]), batch.context_lens, 1.0)
    with pytest.raises(RuntimeError, match="heads not a multiple"):
        ext.paged_attention(torch.randn(1, 3, 32), batch.k_cache, batch.v_cache,
                            batch.block_tables, cu_seqlens([1]), batch.context_lens, 1.0)


def test_vexp_softmax_matches_float64_over_a_wide_score_range(isa: str) -> None:
    # Scores from -100 to +100 exercise the polynomial exp's range reduction and its
    # underflow to exactly 0; one huge score makes every other weight vanish.
    batch = make_paged_batch([130, 17, 64], 16, 1, 64, seed=3)
    query = torch.randn(3, 2, 64) * 6.0
    out = cpu_native.decode_attention(
        query, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, 1.0)
    for i in range(3):
        want = naive_attention(query[i : i + 1], batch.keys[i], batch.values[i], 1.0)
        torch.testing.assert_close(out[i : i + 1].double(), want, atol=1e-5, rtol=1e-5)


def test_the_default_build_follows_the_override_else_the_widest(
    isa: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cpu_native.default_isa() == isa  # the fixture set INFLIGHT_CPU_ISA
    monkeypatch.delenv(cpu_native.ISA_ENV)
    widest = cpu_native.supported_isas()[0]
    assert widest in ("avx512", "avx2") and cpu_native.default_isa() == widest


def test_an_unknown_or_unsupported_isa_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_native.ISA_ENV, "neon")
    with pytest.raises(ValueError, match="expected one of"):
        cpu_native.default_isa()
    if "avx512" not in cpu_native.supported_isas():
        monkeypatch.setenv(cpu_native.ISA_ENV, "avx512")
        with pytest.raises(RuntimeError, match="supports only"):
            cpu_native.default_isa()


def test_cpu_devices_get_the_native_backend() -> None:
    assert get_backend("cpu").name == "cpu"
    assert get_backend("cpu", prefer="torch").name == "torch"
    with pytest.raises(ValueError, match="unknown attention backend"):
        get_backend("cpu", prefer="metal")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_kv_matches_the_reference(dtype: torch.dtype) -> None:
    backend = cpu_native.make_backend()
    gen = torch.Generator().manual_seed(5)
    qkv = torch.randn(6, (9 + 2 * 3) * 8, generator=gen).to(dtype)  # [T, (Hq + 2 Hkv) * D]
    key = qkv[:, 72:96].view(6, 3, 8)  # strided rows, as the model passes them
    value = qkv[:, 96:].view(6, 3, 8)
    slots = torch.tensor([5, -1, 0, 31, 17, -3])  # negative: skipped
    want_k, want_v = torch.zeros(4, 8, 3, 8, dtype=dtype), torch.zeros(4, 8, 3, 8, dtype=dtype)
    got_k, got_v = want_k.clone(), want_v.clone()
    reference.write_kv(key, value, want_k, want_v, slots)
    backend.write_kv(key, value, got_k, got_v, slots)
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
    half_k, half_v = torch.zeros(4, 8, 3, 8, dtype=torch.float16), torch.zeros(4, 8, 3, 8, dtype=torch.float16)
    backend.write_kv(key, value, half_k, half_v, slots)  # another cache dtype: cast as the reference does
    assert torch.equal(half_k, want_k.to(torch.float16))
    with pytest.raises(RuntimeError, match="past the pool"):
        backend.write_kv(key, value, got_k, got_v, torch.tensor([0, 1, 2, 3, 4, 32]))


# --- sliding window and soft-capping ----------------------------------------------------


@pytest.mark.parametrize("block_size", [16, 12])
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("softcap", SOFTCAPS)
@pytest.mark.parametrize("head_dim", [64, 48])  # register-blocked and scalar
def test_decode_window_softcap(block_size: int, window: int, softcap: float, head_dim: int) -> None:
    """GQA (8 query heads on 2 KV heads), ragged contexts, NaN/-1 blocks before the window."""
    lens = [*WINDOW_CONTEXTS, 300]
    batch = make_paged_batch(lens, block_size, 2, head_dim, seed=window + block_size)
    dropped, _ = drop_blocks_before_window(batch, [1] * len(lens), window)
    query = scores_query(len(lens), 8, head_dim, seed=head_dim)
    scale = head_dim**-0.5
    args = (query, dropped.k_cache, dropped.v_cache, dropped.block_tables, dropped.context_lens,
            scale, window, softcap)
    out = cpu_native.decode_attention(*args)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out, reference.decode_attention(*args), atol=2e-6, rtol=2e-5)
    for i in range(len(lens)):
        want = naive_attention(query[i : i + 1], batch.keys[i], batch.values[i], scale, window, softcap)
        torch.testing.assert_close(out[i : i + 1].double(), want, atol=1e-5, rtol=1e-5)


# (context_len, q_len) of steps the native kernel takes (every chunk <= SHORT_CHUNK: tiles of
# 8 queries, each tile's window start in a different block) and of one that falls back to
# the reference (a chunk longer than SHORT_CHUNK).
NATIVE_LAYOUT = [(1, 1), (16, 16), (33, 19), (40, 7), (90, 32), (20, 0), (70, 1)]
FALLBACK_LAYOUT = [(33, 33), (40, 7), (300, 150), (20, 0)]


@pytest.mark.parametrize("layout", [NATIVE_LAYOUT, FALLBACK_LAYOUT], ids=["native", "fallback"])
@pytest.mark.parametrize("block_size", [16, 12])
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("softcap", SOFTCAPS)
def test_prefill_window_softcap(
    layout: list[tuple[int, int]], block_size: int, window: int, softcap: float
) -> None:
    contexts = [c for c, _ in layout]
    q_lens = [q for _, q in layout]
    assert (max(q_lens) > cpu_native.SHORT_CHUNK) == (layout is FALLBACK_LAYOUT)
    batch = make_paged_batch(contexts, block_size, 2, 64, seed=window + 3)
    dropped, _ = drop_blocks_before_window(batch, q_lens, window)
    query = scores_query(sum(q_lens), 8, 64, seed=block_size)
    cu = cu_seqlens(q_lens)
    out = cpu_native.prefill_attention(
        query, dropped.k_cache, dropped.v_cache, dropped.block_tables, cu, dropped.context_lens,
        0.125, window, softcap,
    )  # fmt: skip
    for i in range(len(layout)):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        want = naive_attention(query[rows], batch.keys[i], batch.values[i], 0.125, window, softcap)
        torch.testing.assert_close(out[rows].double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [1, 7, 33])
def test_blocks_before_the_window_are_not_read(window: int) -> None:
    """NaN blocks and -1 table entries before the window: the same bits as with them intact."""
    ext = cpu_native.load_extension()
    contexts = [c for c, _ in NATIVE_LAYOUT]
    q_lens = [q for _, q in NATIVE_LAYOUT]
    batch = make_paged_batch(contexts, 12, 2, 64, seed=8)
    dropped, count = drop_blocks_before_window(batch, q_lens, window)
    assert count > 0
    query = scores_query(sum(q_lens), 8, 64, seed=8)
    cu = cu_seqlens(q_lens)
    for softcap in SOFTCAPS:
        clean = ext.paged_attention(query, batch.k_cache, batch.v_cache, batch.block_tables, cu,
                                    batch.context_lens, 0.125, window, softcap)
        poisoned = ext.paged_attention(query, dropped.k_cache, dropped.v_cache,
                                       dropped.block_tables, cu, dropped.context_lens, 0.125,
                                       window, softcap)
        assert torch.equal(clean, poisoned)


def test_the_backend_passes_window_and_softcap() -> None:
    backend = cpu_native.make_backend()
    batch = make_paged_batch([100, 40], 16, 2, 64, seed=6)
    query = scores_query(2, 4, 64, seed=6)
    args = (query, batch.k_cache, batch.v_cache, batch.block_tables)
    got = backend.decode_attention(*args, batch.context_lens, 0.125, window=20, softcap=50.0)
    want = reference.decode_attention(*args, batch.context_lens, 0.125, window=20, softcap=50.0)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=2e-5)
    cu = cu_seqlens([1, 1])
    got = backend.prefill_attention(*args, cu, batch.context_lens, 0.125, window=20, softcap=50.0)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=2e-5)
    with pytest.raises(ValueError, match="window must be >= 0"):
        backend.decode_attention(*args, batch.context_lens, 0.125, window=-3)


def test_vector_tanh_matches_torch() -> None:
    """The soft-cap's tanh: a few fp32 ulp from float64 tanh, near 0, at the switch from the
    polynomial to the exponential form (0.625), and saturated (exactly +-1)."""
    ext = cpu_native.load_extension()
    x = torch.cat([
        torch.linspace(-30.0, 30.0, 200_001),
        torch.linspace(0.6, 0.65, 1001), torch.linspace(-0.65, -0.6, 1001),
        torch.tensor([0.0, -0.0, 1e-30, -1e-20, 1e-7, 3e-4, 100.0, -1e4, 88.0, -90.0]),
    ])  # fmt: skip
    got = ext.vector_tanh(x)
    want = torch.tanh(x.double())
    assert torch.equal(got[-4:], torch.tensor([1.0, -1.0, 1.0, -1.0]))
    torch.testing.assert_close(got.double(), want, atol=0, rtol=3e-7)
    assert torch.equal(ext.vector_tanh(x[:13].view(13, 1)).view(-1), got[:13])  # a partial vector


# --- contexts cut into segments ---------------------------------------------------------

# Around the boundary of a work item's softmax chunks (256 keys with blocks of 16, 252 with
# blocks of 12), around the segment boundary (512 keys; 504 with blocks of 12), and
# contexts of several segments: each segment is a work item of its own, merged after.
LONG_CONTEXTS = [255, 256, 257, 503, 505, 511, 512, 513, 1100]


@pytest.mark.parametrize("block_size", [16, 12])
@pytest.mark.parametrize("window", [0, 300, 40])
def test_long_contexts_are_cut_into_segments_and_merged(block_size: int, window: int) -> None:
    batch = make_paged_batch(LONG_CONTEXTS, block_size, 2, 64, seed=block_size + window)
    dropped, _ = drop_blocks_before_window(batch, [1] * len(LONG_CONTEXTS), window)
    query = scores_query(len(LONG_CONTEXTS), 6, 64, seed=window)
    args = (query, dropped.k_cache, dropped.v_cache, dropped.block_tables, dropped.context_lens,
            0.125, window, 0.0)
    out = cpu_native.decode_attention(*args)
    torch.testing.assert_close(out, reference.decode_attention(*args), atol=2e-6, rtol=2e-5)
    for i in range(len(LONG_CONTEXTS)):
        want = naive_attention(query[i : i + 1], batch.keys[i], batch.values[i], 0.125, window)
        torch.testing.assert_close(out[i : i + 1].double(), want, atol=1e-5, rtol=1e-5)
    # a prefill chunk whose tiles cross a segment boundary (prefix 490, 30 new tokens)
    chunk = make_paged_batch([520], block_size, 2, 64, seed=5)
    q = scores_query(30, 6, 64, seed=6)
    got = cpu_native.prefill_attention(q, chunk.k_cache, chunk.v_cache, chunk.block_tables,
                                       cu_seqlens([30]), chunk.context_lens, 0.125, window, 0.0)
    want = naive_attention(q, chunk.keys[0], chunk.values[0], 0.125, window)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_a_sequence_gets_the_same_output_in_any_batch() -> None:
    """Bitwise: the cut into segments depends on the sequence alone, not on how many
    others share the call (so not on how many threads are idle)."""
    lens = [600, 30, 1000, 257]
    batch = make_paged_batch(lens, 16, 2, 64, seed=9)
    query = scores_query(len(lens), 6, 64, seed=9)
    together = cpu_native.decode_attention(query, batch.k_cache, batch.v_cache,
                                           batch.block_tables, batch.context_lens, 0.125)
    for i in range(len(lens)):
        alone = cpu_native.decode_attention(query[i : i + 1], batch.k_cache, batch.v_cache,
                                            batch.block_tables[i : i + 1],
                                            batch.context_lens[i : i + 1], 0.125)
        assert torch.equal(alone, together[i : i + 1])


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_kv_heads_cut_between_idle_threads_give_the_same_output(threads: int) -> None:
    """Bitwise: with fewer work items than threads a tile's KV heads are cut into groups
    (each its own item, segments' partial states included); one thread cuts nothing."""
    lens = [30, 257, 700]  # one segment; one, at a block boundary; two, merged from partials
    batch = make_paged_batch(lens, 16, 3, 64, seed=13)
    query = scores_query(len(lens), 9, 64, seed=13)
    backend = cpu_native.make_backend()
    before = torch.get_num_threads()
    results = {}
    for n in (1, threads):
        torch.set_num_threads(n)
        try:
            for i in range(len(lens)):
                args = (query[i : i + 1], batch.k_cache, batch.v_cache, batch.block_tables[i : i + 1],
                        batch.context_lens[i : i + 1], 0.125)
                results[n, i, "plain"] = backend.decode_attention(*args)
                results[n, i, "window"] = backend.decode_attention(*args, window=100, softcap=30.0)
        finally:
            torch.set_num_threads(before)
    for (_, i, kind), out in results.items():
        assert torch.equal(out, results[1, i, kind]), f"{threads} threads, sequence {i}, {kind}"
