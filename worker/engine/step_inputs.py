"""A step's packed input tensors, built with one pass over its sequences and vectorised
arithmetic, and moved to the device in one copy.

Every integer input of a step (token ids, positions, KV slots, query and key offsets,
context lengths, the logits rows and the block tables) is written into one int64 host
buffer, laid out in that order, and the device gets the whole buffer in one
non-blocking copy; the tensors the forward reads are views of it. On CUDA the host
buffers are pinned and there are two of them, used in turn: a buffer is written again
only once the copy that read it two steps ago has finished (an event per buffer), so a
step may be built while the previous one still runs. On the CPU the buffer is the
tensors themselves: no copy at all.

The block tables come from :class:`~worker.engine.block_tables.BlockTables`, whose rows
the block manager keeps current, as one gather. Python touches each sequence once (its
row, start, query length and query tokens); everything per token is numpy.
"""

from __future__ import annotations

from itertools import accumulate, chain

import numpy as np
import torch

from worker.engine.attention_metadata import AttentionMetadata
from worker.engine.block_tables import BlockTables
from worker.engine.step_plan import SchedulerOutput

# The packed buffer's segments, in order (block_tables last: its width varies).
SEGMENTS = ("input_ids", "positions", "slot_mapping", "cu_seqlens_q", "cu_seqlens_k",
            "context_lens", "logits_indices", "block_tables")


class StepInputs:
    """Builds each step's ``input_ids`` and :class:`AttentionMetadata` (see module doc)."""

    def __init__(self, device: torch.device, block_size: int, tables: BlockTables) -> None:
        self.device = device
        self.block_size = block_size
        self.tables = tables
        self.pinned = device.type == "cuda"
        self._host: list[torch.Tensor | None] = [None, None]  # CUDA: two pinned buffers, used in turn
        self._copied: list[torch.cuda.Event | None] = [None, None]  # when each was last read
        self._turn = 0

    def build(self, plan: SchedulerOutput) -> tuple[torch.Tensor, AttentionMetadata]:
        """Packed ``input_ids`` ``[num_tokens]`` and the metadata of ``plan`` (decodes first)."""
        bs = self.block_size
        scheduled = plan.scheduled
        num_seqs = len(scheduled)
        # one pass over the sequences: (query rows, first position, block-table row) of each
        per_seq = np.fromiter(
            chain.from_iterable((s.num_new_tokens, s.start, s.seq.table_row) for s in scheduled),
            dtype=np.int64, count=3 * num_seqs).reshape(num_seqs, 3)  # [num_seqs, 3]
        q_lens, starts, table_rows = per_seq[:, 0], per_seq[:, 1], per_seq[:, 2]  # [num_seqs] each
        num_tokens = int(q_lens.sum())
        num_decode = sum(1 for s in scheduled if s.num_new_tokens == 1)  # decodes come first
        if num_decode == num_tokens:  # every row is a decode: one token each
            token_ids: list[int] = [s.seq.token_ids[s.start] for s in scheduled]
        else:
            token_ids = [s.seq.token_ids[s.start] for s in scheduled[:num_decode]]
            for s in scheduled[num_decode:]:
                token_ids += s.query_token_ids()
        context_lens = starts + q_lens  # [num_seqs]
        width = int(-(-int(context_lens.max()) // bs))
        logits_rows = plan.logits_rows.token_indices
        sizes = (num_tokens, num_tokens, num_tokens, num_seqs + 1, num_seqs + 1, num_seqs,
                 len(logits_rows), num_seqs * width)
        bounds = list(accumulate(sizes, initial=0))  # each segment's offset, then the total
        staged = self._staging(bounds[-1])  # [total] int64, host
        packed = staged.numpy()  # the same memory, written through numpy
        parts = {name: packed[a:b] for name, a, b in zip(SEGMENTS, bounds, bounds[1:], strict=False)}
        parts["input_ids"][:] = token_ids
        cu_q, cu_k = parts["cu_seqlens_q"], parts["cu_seqlens_k"]
        cu_q[0] = cu_k[0] = 0
        np.cumsum(q_lens, out=cu_q[1:])
        np.cumsum(context_lens, out=cu_k[1:])
        parts["context_lens"][:] = context_lens
        parts["logits_indices"][:] = logits_rows
        tables = parts["block_tables"].reshape(num_seqs, width)  # [num_seqs, width]
        self.tables.gather(table_rows, out=tables)
        # positions of every token: start_i, start_i + 1, ... for each sequence
        positions = parts["positions"]
        if num_decode == num_tokens:
            positions[:] = starts
            seq_of_token = np.arange(num_seqs)  # [num_tokens]: token i is sequence i's
        else:
            seq_of_token = np.repeat(np.arange(num_seqs), q_lens)  # [num_tokens]
            positions[:] = np.arange(num_tokens) - cu_q[seq_of_token] + starts[seq_of_token]
        slots = parts["slot_mapping"]  # [num_tokens]
        slots[:] = tables[seq_of_token, positions // bs] * bs + positions % bs
        if plan.num_pad_rows:
            pads = [int(cu_q[i]) for i, s in enumerate(scheduled) if s.is_pad]
            slots[pads] = -1  # pad rows re-read cached K/V and write none
        views = dict(zip(SEGMENTS, self._to_device(staged, sizes), strict=True))
        meta = AttentionMetadata(
            positions=views["positions"], slot_mapping=views["slot_mapping"],
            cu_seqlens_q=views["cu_seqlens_q"], cu_seqlens_k=views["cu_seqlens_k"],
            context_lens=views["context_lens"],
            block_tables=views["block_tables"].view(num_seqs, width),  # [num_seqs, width]
            num_decode_seqs=num_decode, logits_indices=views["logits_indices"],
        )
        return views["input_ids"], meta

    def _staging(self, numel: int) -> torch.Tensor:
        """The host buffer of this step: a fresh array on the CPU; on CUDA the next pinned
        buffer, once the copy that last read it has finished (grown when too small)."""
        if not self.pinned:
            return torch.empty(numel, dtype=torch.int64)
        turn = self._turn = 1 - self._turn
        copied = self._copied[turn]
        if copied is not None:
            copied.synchronize()  # the copy that read it two steps ago (done unless the host ran ahead)
        host = self._host[turn]
        if host is None or host.numel() < numel:
            size = numel if host is None else max(numel, 2 * host.numel())
            host = self._host[turn] = torch.empty(size, dtype=torch.int64, pin_memory=True)
        return host[:numel]

    def _to_device(self, host: torch.Tensor, sizes: tuple[int, ...]) -> list[torch.Tensor]:
        """The segments as tensors on the device: one copy of the whole buffer (none on
        the CPU), split into views."""
        if self.pinned:
            device_buffer = host.to(self.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._copied[self._turn] = event
            host = device_buffer
        return list(host.split(sizes))
