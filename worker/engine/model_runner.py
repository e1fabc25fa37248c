"""Turn a scheduled step into one packed batch, run the model, return last-token logits."""

from __future__ import annotations

import numpy as np
import torch

from kernels import AttentionBackend
from worker.engine.attention_metadata import AttentionMetadata
from worker.engine.decode_graphs import DecodeGraphs
from worker.engine.models.llama import LlamaForPackedCausalLM
from worker.engine.scheduler import ScheduledSequence


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """Bytes of K and V, all layers, for one token."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * itemsize


class ModelRunner:
    """Owns the model and the KV pool; builds the step's tensors without any padding."""

    def __init__(
        self,
        *,
        model: LlamaForPackedCausalLM,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        dtype: torch.dtype,
        backend: AttentionBackend,
        max_num_seqs: int = 64,
        max_model_len: int = 2048,
        use_decode_graphs: bool | None = None,
    ) -> None:
        config = model.config
        self.model = model
        self.device = device
        self.block_size = block_size
        self.backend = backend
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shape = (num_blocks, block_size, config.num_key_value_heads, head_dim)
        # One tensor per K/V for all layers: [num_layers, num_blocks, block_size, Hkv, D]
        self.k_pool = torch.zeros((config.num_hidden_layers, *shape), dtype=dtype, device=device)
        self.v_pool = torch.zeros((config.num_hidden_layers, *shape), dtype=dtype, device=device)
        self.kv_caches = [(self.k_pool[i], self.v_pool[i]) for i in range(config.num_hidden_layers)]
        self.pin = device.type == "cuda"  # stage host inputs in pinned memory for async copies
        if use_decode_graphs is None:
            use_decode_graphs = device.type == "cuda"
        self.decode_graphs: DecodeGraphs | None = None
        if use_decode_graphs:
            self.decode_graphs = DecodeGraphs(
                model=model, kv_caches=self.kv_caches, backend=backend, device=device,
                max_batch=max_num_seqs, max_blocks_per_seq=-(-max_model_len // block_size),
            )
            self.decode_graphs.capture()

    def build_inputs(self, scheduled: list[ScheduledSequence]) -> tuple[torch.Tensor, AttentionMetadata]:
        """Packed ``input_ids`` and the AttentionMetadata of a step (decodes come first)."""
        bs = self.block_size
        num_seqs = len(scheduled)
        q_lens = np.fromiter((s.num_new_tokens for s in scheduled), dtype=np.int64, count=num_seqs)
        starts = np.fromiter((s.seq.num_computed_tokens for s in scheduled), dtype=np.int64, count=num_seqs)
        context_lens = starts + q_lens  # [num_seqs]
        cu_q = np.zeros(num_seqs + 1, dtype=np.int64)
        np.cumsum(q_lens, out=cu_q[1:])
        cu_k = np.zeros(num_seqs + 1, dtype=np.int64)
        np.cumsum(context_lens, out=cu_k[1:])
        max_blocks = int(-(-context_lens.max() // bs))
        block_tables = np.zeros((num_seqs, max_blocks), dtype=np.int64)  # [num_seqs, max_blocks]
        input_ids: list[int] = []
        for i, s in enumerate(scheduled):
            table = s.seq.block_table[: -(-int(context_lens[i]) // bs)]
            block_tables[i, : len(table)] = table
            input_ids.extend(s.seq.token_ids[starts[i] : context_lens[i]])
            if s.num_draft_tokens:
                input_ids.extend(s.seq.draft_token_ids[: s.num_draft_tokens])
        # positions of every token: start_i, start_i + 1, ... for each sequence
        seq_of_token = np.repeat(np.arange(num_seqs), q_lens)  # [num_tokens]
        positions = np.arange(int(cu_q[-1]), dtype=np.int64) - cu_q[seq_of_token] + starts[seq_of_token]
        slot_mapping = block_tables[seq_of_token, positions // bs] * bs + positions % bs
        # Logits rows: each sampling sequence's last token, plus its drafts' rows before it.
        rows: list[int] = []
        for i, s in enumerate(scheduled):
            if s.samples:
                end = int(cu_q[i + 1])
                rows.extend(range(end - 1 - s.num_draft_tokens, end))
        logits_indices = np.asarray(rows, dtype=np.int64)
        num_decode = int(np.count_nonzero(q_lens == 1))
        dev = self.device

        def t(a: np.ndarray) -> torch.Tensor:
            host = torch.from_numpy(a)
            if self.pin:
                host = host.pin_memory()
            return host.to(dev, non_blocking=True)

        meta = AttentionMetadata(
            positions=t(positions),
            slot_mapping=t(slot_mapping),
            cu_seqlens_q=t(cu_q),
            cu_seqlens_k=t(cu_k),
            context_lens=t(context_lens),
            block_tables=t(block_tables),
            num_decode_seqs=num_decode,
            logits_indices=t(logits_indices),
        )
        ids = t(np.asarray(input_ids, dtype=np.int64))
        return ids, meta

    @torch.inference_mode()
    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy whole KV blocks, all layers (copy-on-write of shared partial blocks)."""
        if not copies:
            return
        src = torch.tensor([s for s, _ in copies], device=self.device)
        dst = torch.tensor([d for _, d in copies], device=self.device)
        self.k_pool[:, dst] = self.k_pool[:, src]  # [num_layers, num_copies, bs, Hkv, D]
        self.v_pool[:, dst] = self.v_pool[:, src]

    @torch.inference_mode()
    def execute(self, scheduled: list[ScheduledSequence]) -> torch.Tensor:
        """Run one step; logits ``[num_rows, vocab]`` in scheduled order: one row per sampling
        sequence, ``1 + num_draft_tokens`` rows for one that checks drafts."""
        input_ids, meta = self.build_inputs(scheduled)
        graphs = self.decode_graphs
        if (graphs is not None and meta.num_decode_seqs == meta.num_seqs
                and graphs.fits(meta.num_seqs, meta.block_tables.shape[1])):
            return graphs.run(input_ids, meta)
        return self.model(input_ids, meta, self.kv_caches, self.backend)
