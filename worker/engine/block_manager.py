"""The paged KV pool: fixed-size blocks handed out on demand, with an optional prefix cache.

Freed blocks sit in two insertion-ordered dicts (O(1) pop of the oldest, O(1) removal
when a cached block is revived): those holding nothing findable, and the prefix cache's
LRU. With prefix caching on, a full block whose K/V has been computed is published under
a hash chain (parent hash, tenant salt, the block's token ids); a block freed by every
owner stays findable until the LRU hands it out again. Sequences release their blocks
tail first, so a sequence's tail is evicted before its head.

Freed plain blocks go first. Then, where the pool's memory is committed from the start
(CUDA, or ``commit_kv_pool``), blocks never handed out come before the cached LRU, so the
cache keeps what the pool holds. On the CPU by default the pool's pages are committed when
first written, so never-used blocks come last: the memory the pool holds follows the peak
number of blocks in use, not the pool's size, and the cache keeps what that peak left free.

Sliding windows (``window`` W > 0: every layer of the model is windowed, W the widest): the
query at position p reads only keys p - W < k <= p, so once a sequence has computed ``c``
tokens its blocks wholly before key c - W + 1 are never read again. After each step
``release_out_of_window`` drops the sequence's reference to them like ``free`` does (a
block shared by a cached prefix or a forked sample stays with its other holders; a freed
published block goes to the cache's LRU and stays findable) and leaves ``RELEASED`` (-1)
at their indices, so index i still holds positions i * block_size onwards. The released
entries are always a prefix of the table (``num_released``); the attention kernels never
read them. With W == 0 (a layer sees the whole context) nothing is ever released.
"""

from __future__ import annotations

import bisect

from worker.engine.block_tables import BlockTables
from worker.engine.sequence import Sequence

RELEASED = -1  # a block-table entry whose block slid out of every layer's window


def num_released(block_table: list[int]) -> int:
    """How many leading entries of ``block_table`` are RELEASED (they always form a prefix)."""
    if not block_table or block_table[0] != RELEASED:
        return 0  # the common case, and always without a window
    return bisect.bisect_left(block_table, True, key=lambda b: b != RELEASED)


class BlockManager:
    """Allocation, reference counts and the prefix cache of ``num_blocks`` KV blocks."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False,
                 *, never_used_last: bool = False, window: int = 0,
                 tables: BlockTables | None = None) -> None:
        if window < 0:
            raise ValueError(f"window={window}: must be >= 0 (0: no sliding window)")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.window = window  # the model's widest sliding window; 0: some layer sees everything
        self.enable_prefix_caching = enable_prefix_caching
        self.never_used_last = never_used_last  # evict cached blocks before touching new ones
        self.ref_counts = [0] * num_blocks
        self.free_plain: dict[int, None] = {}  # freed, holding nothing findable
        self.free_cached: dict[int, None] = {}  # freed, published: the LRU, oldest first
        self.num_touched = 0  # blocks 0 .. num_touched - 1 have been handed out
        self.block_hashes: list[int | None] = [None] * num_blocks
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # hash -> block id
        self.num_shared = 0  # blocks held by more than one sequence
        # every change to a sequence's block_table, mirrored (the model runner's, to gather)
        self.tables = tables if tables is not None else BlockTables()

    # -- capacity ---------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks not owned by any sequence (cached, plain or never handed out)."""
        return len(self.free_plain) + len(self.free_cached) + self.num_blocks - self.num_touched

    @property
    def num_used_blocks(self) -> int:
        """Blocks owned by at least one sequence."""
        return self.num_blocks - self.num_free_blocks

    def is_free(self, block: int) -> bool:
        """Whether no sequence owns ``block``."""
        return block in self.free_plain or block in self.free_cached or block >= self.num_touched

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def num_new_blocks(self, seq: Sequence, num_tokens: int) -> int:
        """Extra blocks ``seq`` needs so that ``num_tokens`` of its tokens fit (RELEASED
        entries keep their index, so the table's length is still the blocks it spans)."""
        return max(0, self.blocks_needed(num_tokens) - len(seq.block_table))

    def can_grow(self, seq: Sequence, num_tokens: int, keep_free: int = 0) -> bool:
        """Whether ``seq`` can hold ``num_tokens`` tokens with the free blocks left, leaving
        ``keep_free`` of them free."""
        extra = 1 if self.needs_copy_on_write(seq) else 0
        return self.num_new_blocks(seq, num_tokens) + extra <= self.num_free_blocks - keep_free

    # -- sharing between the samples of one request -----------------------------------
    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Let ``child`` share all of ``parent``'s blocks (reference counted); its released
        entries stay released in the child."""
        for block in parent.block_table[num_released(parent.block_table):]:
            self._ref_up(block)
        child.block_table = list(parent.block_table)
        self.tables.load(child)
        child.num_hashed_blocks = parent.num_hashed_blocks
        child.block_hash = parent.block_hash

    def needs_copy_on_write(self, seq: Sequence) -> bool:
        """True when ``seq``'s next token lands in a block another sequence also holds (that
        block holds position num_computed_tokens, inside the window: never RELEASED)."""
        index = seq.num_computed_tokens // self.block_size
        return index < len(seq.block_table) and self.ref_counts[seq.block_table[index]] > 1

    def copy_on_write(self, seq: Sequence) -> tuple[int, int]:
        """Give ``seq`` a private copy of its shared partial block; return (src, dst) for the
        model runner to copy the K/V; the caller checked can_grow."""
        index = seq.num_computed_tokens // self.block_size
        src = seq.block_table[index]
        assert src != RELEASED, "the next token's block is inside the window"
        dst = self._pop_free()
        self._ref_down(src)
        seq.block_table[index] = dst
        self.tables.set(seq, index, dst)
        return src, dst

    # -- allocation -------------------------------------------------------------------
    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Append blocks to ``seq`` until it holds ``num_tokens``; caller checked can_grow."""
        table = seq.block_table
        for _ in range(self.num_new_blocks(seq, num_tokens)):
            table.append(self._pop_free())
            self.tables.set(seq, len(table) - 1, table[-1])

    def _pop_free(self) -> int:
        """A freed plain block first; then a never-used block before the least recently
        freed cached one, or after it with ``never_used_last``."""
        untouched = self.num_touched < self.num_blocks
        if self.free_plain or (self.free_cached and (self.never_used_last or not untouched)):
            queue = self.free_plain or self.free_cached
            block = next(iter(queue))  # the oldest in that queue
            del queue[block]
            self._unpublish(block)
        else:
            assert untouched, "caller checked that a block is free"
            block = self.num_touched
            self.num_touched += 1
        self.ref_counts[block] = 1
        return block

    def free(self, seq: Sequence, *, keep_cached: bool = True, keep_released: bool = False) -> None:
        """Release all of ``seq``'s blocks, tail first; ``keep_cached=False`` drops their hashes.
        ``keep_released``: the table keeps its RELEASED entries (a sequence swapped out, so
        that readmission allocates only the blocks inside its window)."""
        table = seq.block_table
        released = num_released(table)
        for i in range(len(table) - 1, released - 1, -1):
            self._drop(table[i], keep_cached)
        seq.block_table = [RELEASED] * released if keep_released else []
        self.tables.load(seq)
        seq.num_hashed_blocks = 0
        seq.block_hash = None

    def _ref_up(self, block: int) -> None:
        """One holder more for a held or cached ``block``."""
        self.ref_counts[block] += 1
        if self.ref_counts[block] == 2:
            self.num_shared += 1

    def _ref_down(self, block: int) -> int:
        """One holder fewer for ``block``; returns how many are left."""
        self.ref_counts[block] -= 1
        left = self.ref_counts[block]
        if left == 1:
            self.num_shared -= 1
        return left

    def _drop(self, block: int, keep_cached: bool = True) -> None:
        """One holder fewer; a block nobody holds goes to its free queue."""
        if self._ref_down(block) == 0:
            if not keep_cached:
                self._unpublish(block)
            if self.block_hashes[block] is None:
                self.free_plain[block] = None
            else:
                self.free_cached[block] = None

    # -- sliding windows --------------------------------------------------------------
    def num_out_of_window(self, num_computed_tokens: int) -> int:
        """Leading blocks no layer reads again once ``num_computed_tokens`` are computed.

        The next query sits at p >= c = num_computed_tokens and sees keys k > p - W, so
        keys below c - W + 1 are dead; block i (keys i * bs .. (i + 1) * bs - 1) is wholly
        dead when (i + 1) * bs <= c - W + 1. Without a window (W == 0) none is."""
        if not self.window:
            return 0
        return max(0, (num_computed_tokens - self.window + 1) // self.block_size)

    def release_out_of_window(self, seq: Sequence) -> int:
        """Release ``seq``'s blocks that slid out of every layer's window (see the module
        docstring), in position order; return how many were released now."""
        table = seq.block_table
        start = num_released(table)
        end = min(self.num_out_of_window(seq.num_computed_tokens), len(table))
        for i in range(start, end):
            self._drop(table[i])
            table[i] = RELEASED
            self.tables.set(seq, i, RELEASED)
        return max(0, end - start)

    # -- prefix cache -----------------------------------------------------------------
    def _chain(self, parent: int | None, salt: str | None, tokens: tuple[int, ...]) -> int:
        return hash((parent, salt, tokens))

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks holding a prefix of ``seq``'s tokens (never its last token)."""
        if not self.enable_prefix_caching:
            return []
        hits: list[int] = []
        parent: int | None = None
        bs = self.block_size
        # The last token is always recomputed so the step has logits to sample from.
        for i in range((seq.num_tokens - 1) // bs):
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            parent = self._chain(parent, seq.tenant, tokens)
            block = self.cached.get(parent)
            # Equal hashes are not enough: the stored tokens must match too.
            if block is None or self.block_tokens[block] != tokens:
                break
            hits.append(block)
        return hits

    def take_cached(self, seq: Sequence, blocks: list[int]) -> None:
        """Give ``seq`` (holding no blocks) the cached ``blocks`` of its prefix."""
        assert not seq.block_table, "prefix blocks go to a sequence that holds none"
        for block in blocks:
            if self.ref_counts[block] == 0:
                del self.free_cached[block]  # a findable block is in the cache's LRU
            self._ref_up(block)
        seq.block_table = list(blocks)
        self.tables.load(seq)
        seq.num_hashed_blocks = len(blocks)
        seq.block_hash = self.block_hashes[blocks[-1]] if blocks else None
        seq.num_computed_tokens = len(blocks) * self.block_size

    def publish_full_blocks(self, seq: Sequence) -> None:
        """Publish ``seq``'s newly completed full blocks (K/V computed) to the cache."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        for i in range(seq.num_hashed_blocks, seq.num_computed_tokens // bs):
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            seq.block_hash = self._chain(seq.block_hash, seq.tenant, tokens)
            block = seq.block_table[i]
            # a RELEASED entry (a swapped-in sequence hashing again from its start) only
            # moves the chain on
            if (block != RELEASED and seq.block_hash not in self.cached
                    and self.block_hashes[block] is None):
                self.cached[seq.block_hash] = block
                self.block_hashes[block] = seq.block_hash
                self.block_tokens[block] = tokens
            seq.num_hashed_blocks = i + 1

    def _unpublish(self, block: int) -> None:
        block_hash = self.block_hashes[block]
        if block_hash is not None:
            if self.cached.get(block_hash) == block:
                del self.cached[block_hash]
            self.block_hashes[block] = None
            self.block_tokens[block] = None
