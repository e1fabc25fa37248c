"""benchmarks/kv_pool_pages.py on small pools: every kind is a zeroed-then-written pool of the
cache's shape, and the paired rounds time every kind at every batch size."""

from __future__ import annotations

import pytest

from benchmarks import kv_pool_pages


def test_every_kind_is_a_written_pool_of_the_cache_shape() -> None:
    for kind in kv_pool_pages.KINDS:
        cache = kv_pool_pages.pool(kind, 8)
        assert cache.shape == (8, kv_pool_pages.BLOCK_SIZE, kv_pool_pages.KV_HEADS, kv_pool_pages.HEAD_DIM)
        assert cache.is_contiguous() and int(cache.count_nonzero()) == cache.numel()


def test_paired_rounds_time_every_kind_and_refuse_a_batch_the_pools_cannot_hold() -> None:
    pools = {kind: [(kv_pool_pages.pool(kind, 16), kv_pool_pages.pool(kind, 16)) for _ in range(2)]
             for kind in kv_pool_pages.KINDS}
    times = kv_pool_pages.time_kinds(pools, batch=2, context=40, rounds=2)
    assert set(times) == set(kv_pool_pages.KINDS)
    assert all(len(t) == 2 and all(ms > 0 for ms in t) for t in times.values())
    with pytest.raises(ValueError, match="need 18 blocks"):
        kv_pool_pages.time_kinds(pools, batch=6, context=48, rounds=1)
