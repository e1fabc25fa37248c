"""Decode steps replayed from CUDA graphs, one graph per batch size of a ladder.

A decode-only step (one token per sequence) has shapes fixed by its batch size, so it can
be captured once per size and replayed: the smallest captured size that fits is used and
the extra rows are padding that writes nothing (slot -1) and attends to one slot. On a
device without CUDA graphs the same static buffers run eagerly, which keeps the padding
logic testable on the CPU.
"""

from __future__ import annotations

import torch

from kernels import AttentionBackend
from worker.engine.attention_metadata import AttentionMetadata
from worker.engine.models.decoder import PackedCausalLM


def batch_ladder(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then steps of 8 up to ``max_batch`` (as vLLM does)."""
    sizes = [b for b in (1, 2, 4) if b < max_batch]
    sizes += list(range(8, max_batch + 1, 8))
    if not sizes or sizes[-1] != max_batch:
        sizes.append(max_batch)
    return sizes


class DecodeGraphs:
    """Static input buffers and one captured (or eager) decode forward per ladder size."""

    def __init__(
        self,
        *,
        model: PackedCausalLM,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        backend: AttentionBackend,
        device: torch.device,
        max_batch: int,
        max_blocks_per_seq: int,
    ) -> None:
        self.model, self.kv_caches, self.backend, self.device = model, kv_caches, backend, device
        self.ladder = batch_ladder(max_batch)
        b = self.ladder[-1]

        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.long, device=device)

        self.input_ids = zeros(b)  # [max_batch]
        self.positions = zeros(b)  # [max_batch]
        self.slot_mapping = zeros(b)  # [max_batch]
        self.context_lens = zeros(b)  # [max_batch]
        self.block_tables = zeros(b, max_blocks_per_seq)  # [max_batch, max_blocks_per_seq]
        self.arange = torch.arange(b + 1, device=device)  # cu_seqlens_q and logits_indices
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.use_graphs = device.type == "cuda"

    def fits(self, num_seqs: int, max_blocks: int) -> bool:
        """Whether a decode step of this size can use the static buffers."""
        return num_seqs <= self.ladder[-1] and max_blocks <= self.block_tables.shape[1]

    def _meta(self, b: int) -> AttentionMetadata:
        return AttentionMetadata(
            positions=self.positions[:b],
            slot_mapping=self.slot_mapping[:b],
            cu_seqlens_q=self.arange[: b + 1],
            cu_seqlens_k=self.arange[: b + 1],  # unused by decode attention
            context_lens=self.context_lens[:b],
            block_tables=self.block_tables[:b],
            num_decode_seqs=b,
            logits_indices=self.arange[:b],
        )

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every ladder size (largest first, sharing one memory pool); CUDA only."""
        if not self.use_graphs:
            return
        self.context_lens.fill_(1)
        self.slot_mapping.fill_(-1)
        pool = None
        for b in reversed(self.ladder):
            meta = self._meta(b)
            self.model(self.input_ids[:b], meta, self.kv_caches, self.backend)  # warm-up
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[b] = self.model(self.input_ids[:b], meta, self.kv_caches, self.backend)
            pool = graph.pool()
            self.graphs[b] = graph

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, meta: AttentionMetadata, *,
            replay: bool = True) -> torch.Tensor:
        """Logits ``[num_seqs, vocab]`` of a decode-only step, through the padded buffers:
        the captured graph of its ladder size, or with ``replay=False`` (and where none was
        captured) the same padded forward run eagerly, which a replay must reproduce."""
        n = meta.num_seqs
        b = next(size for size in self.ladder if size >= n)
        width = meta.block_tables.shape[1]
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(meta.positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.context_lens[:n].copy_(meta.context_lens)
        self.block_tables[:n, :width].copy_(meta.block_tables)
        # Padding rows: write nowhere, attend to a single slot of block 0.
        self.input_ids[n:b].zero_()
        self.positions[n:b].zero_()
        self.slot_mapping[n:b].fill_(-1)
        self.context_lens[n:b].fill_(1)
        self.block_tables[n:b].zero_()
        if replay and b in self.graphs:
            self.graphs[b].replay()
            return self.outputs[b][:n]
        logits = self.model(self.input_ids[:b], self._meta(b), self.kv_caches, self.backend)
        return logits[:n]
