"""The explicit per-step description of a packed batch that every attention layer reads."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    """Where each token of a packed step sits and which KV it may see.

    The step's sequences are ordered decodes first (one query token each), then
    prefill chunks. Sequence i owns query rows ``cu_seqlens_q[i]:cu_seqlens_q[i+1]`` of the
    packed input; its context after this step is ``context_lens[i]`` tokens, of which the
    queries are the last ones.
    """

    positions: torch.Tensor  # [num_tokens] int64, absolute position of each token
    slot_mapping: torch.Tensor  # [num_tokens] int64, KV slot each token writes
    cu_seqlens_q: torch.Tensor  # [num_seqs + 1] int64, query offsets in the packed batch
    cu_seqlens_k: torch.Tensor  # [num_seqs + 1] int64, prefix sums of context_lens
    context_lens: torch.Tensor  # [num_seqs] int64, cached + new tokens per sequence
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int64 (unused entries 0)
    num_decode_seqs: int  # the first num_decode_seqs sequences have exactly one query
    logits_indices: torch.Tensor  # [num_sampled] int64, rows whose logits are needed

    @property
    def num_tokens(self) -> int:
        """Tokens in the packed step."""
        return int(self.positions.shape[0])

    @property
    def num_seqs(self) -> int:
        """Sequences in the step."""
        return int(self.context_lens.shape[0])
