"""What changes a row's logits before sampling: repetition, presence and frequency
penalties, logit_bias, and the min_tokens ban on end-of-sequence tokens (vLLM's semantics).
Rows that ask for none of them are left alone (the logits are returned as they are)."""

from __future__ import annotations

from collections.abc import Sequence, Set

import torch

from worker.engine.sampling_input import SamplingInput
from worker.protocol.sampling_params import SamplingParams


def needs_penalties(params: SamplingParams) -> bool:
    """Whether these params change the logits by what was generated before."""
    return (
        params.repetition_penalty != 1.0
        or params.presence_penalty != 0.0
        or params.frequency_penalty != 0.0
        or bool(params.logit_bias)
    )


def _index(positions: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(positions, dtype=torch.long, device=device)


def token_counts(
    token_lists: list[list[int]], vocab: int, device: torch.device
) -> torch.Tensor:
    """``[len(token_lists), vocab]`` float32 counts of each token id in each list.

    Ids outside ``[0, vocab)`` are not counted (they cannot be sampled either).
    """
    num = len(token_lists)
    counts = torch.zeros((num, vocab + 1), dtype=torch.float32, device=device)  # [P, V+1]
    longest = max((len(ids) for ids in token_lists), default=0)
    if longest:
        padded = [ids + [vocab] * (longest - len(ids)) for ids in token_lists]
        ids_t = torch.tensor(padded, dtype=torch.long, device=device)  # [P, L], pad = vocab
        ids_t = torch.where((ids_t < 0) | (ids_t > vocab), vocab, ids_t)
        counts.scatter_add_(1, ids_t, torch.ones_like(ids_t, dtype=torch.float32))
    return counts[:, :vocab]  # [P, V]: the pad column dropped


def apply_penalties_and_masks(
    logits: torch.Tensor, rows: Sequence[SamplingInput], eos_token_ids: Set[int]
) -> torch.Tensor:
    """Penalties and the min_tokens mask; returns ``logits`` itself when no row needs
    either, else a modified copy."""
    vocab = logits.shape[1]
    device = logits.device
    penalized = [i for i, row in enumerate(rows) if needs_penalties(row.params)]
    under_min = [
        i for i, row in enumerate(rows) if len(row.output_token_ids) < row.params.min_tokens
    ]
    if not penalized and not under_min:
        return logits
    out = logits.clone()

    if penalized:
        sub = [rows[i] for i in penalized]
        p_idx = _index(penalized, device)  # [P]
        sel = out[p_idx]  # [P, V] (a copy)
        out_counts = token_counts([r.output_token_ids for r in sub], vocab, device)

        if any(r.params.repetition_penalty != 1.0 for r in sub):
            prompt_counts = token_counts(
                [r.prompt_token_ids if r.params.repetition_penalty != 1.0 else [] for r in sub],
                vocab,
                device,
            )
            seen = (prompt_counts > 0) | (out_counts > 0)  # [P, V]
            rep = torch.tensor(
                [r.params.repetition_penalty for r in sub], dtype=torch.float32, device=device
            ).unsqueeze(1)  # [P, 1]
            sel = torch.where(seen, torch.where(sel > 0, sel / rep, sel * rep), sel)

        if any(
            r.params.presence_penalty != 0.0 or r.params.frequency_penalty != 0.0 for r in sub
        ):
            presence = torch.tensor(
                [r.params.presence_penalty for r in sub], dtype=torch.float32, device=device
            ).unsqueeze(1)  # [P, 1]
            frequency = torch.tensor(
                [r.params.frequency_penalty for r in sub], dtype=torch.float32, device=device
            ).unsqueeze(1)  # [P, 1]
            sel = sel - frequency * out_counts - presence * (out_counts > 0).float()
        sel = add_logit_bias(sel, sub)
        out[p_idx] = sel

    if under_min:
        mask_rows: list[int] = []
        mask_cols: list[int] = []
        for i in under_min:
            banned = set(eos_token_ids) | set(rows[i].params.stop_token_ids)
            cols = [t for t in banned if 0 <= t < vocab]
            mask_rows.extend([i] * len(cols))
            mask_cols.extend(cols)
        if mask_cols:
            out[_index(mask_rows, device), _index(mask_cols, device)] = float("-inf")
    return out


def add_logit_bias(sel: torch.Tensor, sub: Sequence[SamplingInput]) -> torch.Tensor:
    """``sel`` ``[P, V]`` plus each row's logit_bias (ids inside the vocabulary)."""
    vocab = sel.shape[1]
    rows_i: list[int] = []
    cols: list[int] = []
    values: list[float] = []
    for i, r in enumerate(sub):
        for token, bias in (r.params.logit_bias or {}).items():
            if 0 <= token < vocab:
                rows_i.append(i)
                cols.append(token)
                values.append(float(bias))
    if not cols:
        return sel
    bias_t = torch.zeros_like(sel)  # [P, V]
    bias_t[
        torch.tensor(rows_i, device=sel.device), torch.tensor(cols, device=sel.device)
    ] = torch.tensor(values, dtype=sel.dtype, device=sel.device)
    return sel + bias_t
