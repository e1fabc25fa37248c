"""Swap preemption: a preempted sequence's KV blocks go to host memory and come back.

Preemption by recompute drops a sequence's KV and prefills its whole context again when
it is readmitted; swapping copies the KV blocks to a host pool instead (pinned memory on
CUDA) and back into fresh device blocks on readmission, so no token is computed twice.

The cost rule: recomputing ``t`` tokens costs a prefill of ``t`` tokens (every weight,
plus attention growing with ``t``); swapping costs two copies of ``t`` tokens' KV over
the host link plus a fixed cost per swap (a synchronizing copy, host blocks held while
the sequence waits). For a short context the fixed cost and the host memory dominate and
recompute wins; for a long one the prefill does. ``SwapRule`` swaps when the context to
keep has at least ``min_tokens`` tokens and the host pool has room, else recomputes.

Division of work: ``SwapManager`` (no tensors) owns the host block accounting, the
decision and the copies the next step must make; the scheduler asks it at preemption
and at readmission. ``HostKVPool`` holds the host tensors and makes those copies; the
engine runs it after scheduling, before the forward (swap-outs first: a block freed by a
swap-out may be refilled by a swap-in of the same step).

Sliding windows: blocks released because they slid out of the window (RELEASED entries,
a prefix of the block table, see ``block_manager``) hold nothing any layer reads again, so
only the blocks from the first one still held are copied out. The scheduler keeps the
RELEASED entries in the swapped sequence's table, readmission allocates blocks only after
them, and the swap-in fills those at the same indices.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from worker.engine.block_manager import num_released
from worker.engine.sequence import Sequence
from worker.protocol.sampling_params import InvalidRequestError

BlockCopy = tuple[int, int]  # (source block, destination block)


@dataclass(frozen=True)
class SwapRule:
    """Swap contexts of at least ``min_tokens`` tokens; recompute shorter ones."""

    min_tokens: int = 256

    def prefers_swap(self, num_tokens: int) -> bool:
        """Whether a preempted context of ``num_tokens`` computed tokens should be swapped."""
        return num_tokens >= max(1, self.min_tokens)


@dataclass
class PendingCopies:
    """Block copies the next forward must be preceded by."""

    swap_out: list[BlockCopy] = field(default_factory=list)  # (device, host)
    swap_in: list[BlockCopy] = field(default_factory=list)  # (host, device)


class SwapManager:
    """Host blocks, which sequences hold them, and the copies still to be made.

    Copies planned during one ``schedule()`` run in one batch after it: swap-outs, then
    swap-ins. Host blocks of a swap-in are released only once its copy is made (in
    ``take_pending``), so no swap-out of the same step can overwrite them; a sequence
    swapped in and preempted again in the same step keeps its host blocks, uncopied.
    """

    def __init__(self, num_host_blocks: int, block_size: int, rule: SwapRule) -> None:
        if num_host_blocks < 1:
            raise ValueError(f"num_host_blocks={num_host_blocks}: must be >= 1")
        self.block_size = block_size
        self.rule = rule
        self.num_blocks = num_host_blocks
        self.free_blocks = list(range(num_host_blocks - 1, -1, -1))  # pop() gives 0 first
        # id(seq) -> (seq, host blocks, the block-table index the first host block belongs at)
        self._swapped: dict[int, tuple[Sequence, list[int], int]] = {}
        self._incoming: dict[int, tuple[Sequence, list[int], int]] = {}  # readmitted this step
        self._swap_out: list[BlockCopy] = []  # (device, host) planned this step
        self.total_swapped_out = 0
        self.total_recomputed = 0

    @property
    def num_free_blocks(self) -> int:
        """Host blocks not holding (or about to hand back) a swapped sequence's KV."""
        return len(self.free_blocks)

    def is_swapped(self, seq: Sequence) -> bool:
        """Whether ``seq``'s KV waits in the host pool."""
        return id(seq) in self._swapped

    def swap_out(self, seq: Sequence) -> bool:
        """At preemption, before the scheduler frees ``seq``'s device blocks: plan the copy
        of its computed tokens' blocks (those not released out of the window) to the host
        and return True, or return False (the rule prefers recompute, or the host pool is
        full) and plan nothing."""
        back = self._incoming.pop(id(seq), None)
        if back is not None:  # readmitted this step, its copy-in not made: stays on the host
            self._swapped[id(seq)] = back
            self.total_swapped_out += 1
            return True
        tokens = seq.num_computed_tokens  # a recompute would prefill them all again
        first = num_released(seq.block_table)
        end = -(-tokens // self.block_size)
        if not self.rule.prefers_swap(tokens) or end - first > len(self.free_blocks):
            self.total_recomputed += 1
            return False
        host = [self.free_blocks.pop() for _ in range(first, end)]
        self._swap_out += zip(seq.block_table[first:end], host, strict=True)
        self._swapped[id(seq)] = (seq, host, first)
        self.total_swapped_out += 1
        return True

    def swap_in(self, seq: Sequence) -> None:
        """At readmission, once ``seq`` holds device blocks again: plan the copy back."""
        entry = self._swapped.pop(id(seq), None)
        if entry is not None:
            self._incoming[id(seq)] = entry

    def discard(self, seq: Sequence) -> None:
        """``seq`` left the engine (finished or aborted) while swapped: free its host blocks."""
        entry = self._swapped.pop(id(seq), None)
        if entry is not None:
            self.free_blocks += reversed(entry[1])

    def take_pending(self) -> PendingCopies:
        """The copies planned since the last call, which the caller must make now; the
        host blocks of the swap-ins are free again afterwards."""
        pending = PendingCopies(swap_out=self._swap_out)
        for seq, host, first in self._incoming.values():
            if len(seq.block_table) < first + len(host) or num_released(seq.block_table) != first:
                raise RuntimeError(f"{seq.request_id}: readmitted with {len(seq.block_table)} "
                                   f"blocks, {num_released(seq.block_table)} released, for "
                                   f"{len(host)} swapped ones after {first} released")
            pending.swap_in += zip(host, seq.block_table[first : first + len(host)], strict=True)
            self.free_blocks += reversed(host)
        self._swap_out, self._incoming = [], {}
        return pending


class HostKVPool:
    """Host copies of KV blocks, all layers: ``[num_layers, num_host_blocks, block_size,
    num_kv_heads, head_dim]`` for K and for V, pinned when the device pool is on CUDA."""

    def __init__(self, k_pool: torch.Tensor, v_pool: torch.Tensor, num_host_blocks: int) -> None:
        self.k_pool, self.v_pool = k_pool, v_pool  # [num_layers, num_blocks, bs, Hkv, D]
        shape = (k_pool.shape[0], num_host_blocks, *k_pool.shape[2:])
        pin = k_pool.device.type == "cuda"
        self.k_host = torch.zeros(shape, dtype=k_pool.dtype, pin_memory=pin)
        self.v_host = torch.zeros(shape, dtype=v_pool.dtype, pin_memory=pin)

    @staticmethod
    def bytes_per_block(k_pool: torch.Tensor) -> int:
        """Host bytes one block of K and V (all layers) takes."""
        per_layer_block = k_pool[0, 0].numel() * k_pool.element_size()
        return 2 * k_pool.shape[0] * per_layer_block

    @torch.inference_mode()
    def apply(self, pending: PendingCopies) -> None:
        """Make the planned copies: swap-outs, then swap-ins (see the module docstring)."""
        device = self.k_pool.device
        if pending.swap_out:
            src = torch.tensor([d for d, _ in pending.swap_out], device=device)
            dst = torch.tensor([h for _, h in pending.swap_out])
            for pool, host in ((self.k_pool, self.k_host), (self.v_pool, self.v_host)):
                host[:, dst] = pool.index_select(1, src).cpu()  # [L, n, bs, Hkv, D]
        if pending.swap_in:
            src = torch.tensor([h for h, _ in pending.swap_in])
            dst = torch.tensor([d for _, d in pending.swap_in], device=device)
            for pool, host in ((self.k_pool, self.k_host), (self.v_pool, self.v_host)):
                pool[:, dst] = host.index_select(1, src).to(device)  # [L, n, bs, Hkv, D]


class KVSwapper:
    """The engine's handle: the manager the scheduler consults and the pool that copies."""

    def __init__(self, manager: SwapManager, pool: HostKVPool) -> None:
        self.manager, self.pool = manager, pool

    def apply(self) -> None:
        """Make the copies planned by the last ``schedule()`` (before the forward)."""
        self.pool.apply(self.manager.take_pending())


def make_swapper(k_pool: torch.Tensor, v_pool: torch.Tensor, *, block_size: int,
                 swap_space: int, min_tokens: int) -> KVSwapper | None:
    """A swapper with ``swap_space`` bytes of host pool, or None when it is 0 (recompute)."""
    if swap_space <= 0:
        return None
    per_block = HostKVPool.bytes_per_block(k_pool)
    num_host_blocks = swap_space // per_block
    if num_host_blocks < 1:
        raise InvalidRequestError(f"swap_space={swap_space} bytes is smaller than one KV "
                                  f"block ({per_block} bytes)")
    manager = SwapManager(num_host_blocks, block_size, SwapRule(min_tokens))
    return KVSwapper(manager, HostKVPool(k_pool, v_pool, num_host_blocks))
