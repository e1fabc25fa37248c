"""Prefix cache rules of the BlockManager, pinned on small hand-made cases."""

from __future__ import annotations

from worker.engine.block_manager import BlockManager
from worker.engine.outputs import RequestMetrics
from worker.engine.sequence import Sequence
from worker.protocol.sampling_params import SamplingParams

BS = 4


def make_seq(tokens: list[int], tenant: str | None = None, rid: str = "s") -> Sequence:
    return Sequence(rid, list(tokens), SamplingParams(), RequestMetrics(arrival_time=0.0), tenant=tenant)


def compute_all(bm: BlockManager, seq: Sequence) -> None:
    """Pretend the whole sequence was prefilled: allocate, mark computed, publish."""
    bm.grow(seq, seq.num_tokens)
    seq.num_computed_tokens = seq.num_tokens
    bm.publish_full_blocks(seq)


def test_hit_reuses_full_blocks_but_never_the_last_token() -> None:
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    first = make_seq(list(range(12)))
    compute_all(bm, first)
    again = make_seq(list(range(12)), rid="again")
    # 12 tokens = 3 full blocks, but the last token must be recomputed: 2 blocks hit.
    assert bm.match_prefix(again) == first.block_table[:2]
    longer = make_seq([*range(12), 99], rid="longer")
    assert bm.match_prefix(longer) == first.block_table[:3]
    diverged = make_seq([0, 1, 2, 3, 4, 5, 6, 100, 8, 9], rid="diverged")
    assert bm.match_prefix(diverged) == first.block_table[:1]


def test_no_hit_across_tenants() -> None:
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    compute_all(bm, make_seq(list(range(9)), tenant="a"))
    assert bm.match_prefix(make_seq(list(range(9)), tenant="b", rid="b")) == []
    assert len(bm.match_prefix(make_seq(list(range(9)), tenant="a", rid="a2"))) == 2


def test_hash_collision_cannot_serve_wrong_tokens() -> None:
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    seq = make_seq(list(range(9)))
    compute_all(bm, seq)
    # Forge a collision: the chain value of other tokens now points at seq's first block.
    other = make_seq([50, 51, 52, 53, 54], rid="other")
    bm.cached[bm._chain(None, None, (50, 51, 52, 53))] = seq.block_table[0]
    assert bm.match_prefix(other) == []


def test_only_computed_blocks_are_published_and_aborts_unpublish() -> None:
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    seq = make_seq(list(range(10)))
    bm.grow(seq, 10)
    seq.num_computed_tokens = 5  # one full block computed, the second half done
    bm.publish_full_blocks(seq)
    assert len(bm.cached) == 1
    bm.free(seq, keep_cached=False)  # an abort
    assert bm.cached == {}
    assert bm.match_prefix(make_seq(list(range(10)), rid="x")) == []


def test_freed_blocks_stay_cached_and_lru_evicts_tail_first() -> None:
    bm = BlockManager(4, BS, enable_prefix_caching=True)
    seq = make_seq(list(range(16)))  # exactly the 4 blocks of the pool
    compute_all(bm, seq)
    head, b1, b2, tail = seq.block_table
    bm.free(seq)
    assert list(bm.free_cached) == [tail, b2, b1, head]  # tail first: evicted first
    assert bm.num_free_blocks == 4 and len(bm.cached) == 4
    # A new sequence takes one block: the tail's, and only its hash disappears.
    fresh = make_seq([7, 7, 7], rid="fresh")
    bm.grow(fresh, 3)
    assert fresh.block_table == [tail]
    assert len(bm.cached) == 3
    # The head is still served from the cache, revived in O(1) out of the free queue.
    hit = bm.match_prefix(make_seq(list(range(13)), rid="hit"))
    assert hit == [head, b1, b2]
    reviver = make_seq(list(range(13)), rid="reviver")
    bm.take_cached(reviver, hit)
    assert reviver.num_computed_tokens == 12
    assert bm.num_free_blocks == 0 and all(bm.ref_counts[b] == 1 for b in hit)


def test_shared_blocks_are_reference_counted() -> None:
    bm = BlockManager(8, BS, enable_prefix_caching=True)
    a = make_seq(list(range(9)), rid="a")
    compute_all(bm, a)
    b = make_seq(list(range(9)), rid="b")
    hits = bm.match_prefix(b)
    bm.take_cached(b, hits)
    assert [bm.ref_counts[x] for x in hits] == [2, 2]
    bm.free(a)
    assert [bm.ref_counts[x] for x in hits] == [1, 1]
    assert not any(map(bm.is_free, hits))
    bm.free(b)
    assert bm.num_free_blocks == 8


def _free_one_cached_and_one_plain(bm: BlockManager) -> None:
    cached = make_seq(list(range(8)), rid="cached")  # blocks 0 and 1: full, published
    compute_all(bm, cached)
    partial = make_seq([50, 51], rid="partial")  # block 2: partial, never published
    compute_all(bm, partial)
    assert bm.num_touched == 3
    bm.free(cached)  # tail first: the cache's LRU is [1, 0]
    bm.free(partial)


def test_a_lazily_committed_pool_hands_out_freed_blocks_before_never_used_ones() -> None:
    """Plain freed blocks first, then the cache's LRU, and a never-used block only when no
    freed one is left: the pool's untouched memory stays uncommitted."""
    bm = BlockManager(8, BS, enable_prefix_caching=True, never_used_last=True)
    _free_one_cached_and_one_plain(bm)
    taker = make_seq(list(range(100, 112)), rid="taker")
    bm.grow(taker, 12)  # three blocks
    assert taker.block_table == [2, 1, 0]
    assert bm.num_touched == 3 and bm.cached == {}
    bm.grow(taker, 16)
    assert taker.block_table[-1] == 3 and bm.num_touched == 4
    assert bm.num_free_blocks == 4


def test_a_committed_pool_keeps_cached_blocks_while_never_used_ones_remain() -> None:
    bm = BlockManager(8, BS, enable_prefix_caching=True)
    _free_one_cached_and_one_plain(bm)
    taker = make_seq(list(range(100, 132)), rid="taker")
    bm.grow(taker, 24)  # six blocks
    assert taker.block_table == [2, 3, 4, 5, 6, 7]  # the plain one, then never-used ones
    assert len(bm.cached) == 2  # the cached prefix survives
    bm.grow(taker, 32)
    assert taker.block_table[-2:] == [1, 0] and bm.cached == {}  # then the LRU
