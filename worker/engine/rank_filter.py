"""Top-k then top-p: which tokens a row keeps, as one ``[rows, vocab]`` removal mask.

On the CPU the best ``NUM_CANDIDATES`` tokens are ranked first (``torch.topk``) and the whole
vocabulary is sorted only for rows whose kept set might reach past them; the result is the
same either way (``tests/engine/test_sampler.py`` checks it against a brute force).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# On the CPU, top-k/top-p first look among this many best tokens (torch.topk) and sort
# the whole vocabulary only for rows whose kept set might reach past them.
NUM_CANDIDATES = 1024


def rank_filter_mask(
    logits: torch.Tensor,
    top_k: Sequence[int],
    top_p: Sequence[float],
    *,
    num_candidates: int | None = None,
) -> torch.Tensor:
    """Tokens that top-k then top-p remove: a ``[rows, vocab]`` bool mask (True = removed).

    Tokens rank by logit, equal logits by lower token id first (so ``top_k=1`` keeps
    exactly ``torch.argmax``). Per row, top-k keeps the ``top_k`` best (0 = all); top-p
    then keeps the smallest prefix of that ranking whose probability, renormalized over
    the top-k, reaches ``top_p`` (1 = all; the best token always stays). ``logits`` are
    ``[rows, vocab]``, already divided by the temperature.

    With ``num_candidates`` set, only the best ``num_candidates`` tokens (at least
    ``max(top_k) + 1``) are sorted, and the whole vocabulary only when a row's kept set
    is not decided inside them; the result is the same either way.
    """
    vocab = logits.shape[1]
    device = logits.device
    k = torch.tensor([t if 0 < t < vocab else vocab for t in top_k], device=device)  # [F]
    p = torch.tensor(list(top_p), dtype=torch.float32, device=device)  # [F]
    if num_candidates is not None:
        cand = max(num_candidates, max((t for t in top_k if 0 < t < vocab), default=0) + 1)
        if cand <= vocab // 2:
            vals, idx = torch.topk(logits, cand, dim=-1)  # [F, C], tie order unspecified
            idx, perm = idx.sort(dim=-1)  # [F, C]: token id order ...
            vals = vals.gather(1, perm)
            vals, perm = torch.sort(vals, dim=-1, descending=True, stable=True)  # ... then by value
            idx = idx.gather(1, perm)  # [F, C]: ranked like a stable sort of the whole row
            keep = _kept_ranks(vals, k, p, vocab, torch.logsumexp(logits, dim=-1))  # [F]
            last_kept = vals.gather(1, (keep - 1).unsqueeze(1)).squeeze(1)  # [F]
            # Exact when every token outside the candidates ranks after the kept ones.
            if bool((last_kept > vals[:, -1]).all()):
                return _removed_outside(idx, keep, vocab)
    vals, idx = torch.sort(logits, dim=-1, descending=True, stable=True)  # [F, V]
    return _removed_outside(idx, _kept_ranks(vals, k, p, vocab, None), vocab)


def _kept_ranks(
    vals: torch.Tensor, k: torch.Tensor, p: torch.Tensor, vocab: int, lse: torch.Tensor | None
) -> torch.Tensor:
    """How many of the best tokens each row keeps; ``vals`` ``[F, C]`` ranked logits (the
    whole row when ``lse`` is None, else its best C, ``lse`` the row's logsumexp)."""
    ranks = torch.arange(vals.shape[1], device=vals.device).unsqueeze(0)  # [1, C]
    in_k = ranks < k.unsqueeze(1)  # [F, C]
    norm = torch.logsumexp(vals.masked_fill(~in_k, float("-inf")), dim=-1)  # [F]
    if lse is not None:
        norm = torch.where(k < vocab, norm, lse)  # without top-k, mass spreads past the candidates
    probs = torch.exp(vals - norm.unsqueeze(1)).masked_fill(~in_k, 0.0)  # [F, C]
    mass_before = probs.cumsum(dim=-1) - probs  # [F, C]: mass of the better-ranked tokens
    # A token stays while the mass before it is still short of top_p; the best token always
    # stays (vLLM, HF), also for a top_p so small that it is 0 in float32 (1e-300).
    in_p = (mass_before < p.unsqueeze(1)) | (p >= 1.0).unsqueeze(1) | (ranks == 0)  # [F, C]
    return (in_k & in_p).sum(dim=-1)  # [F]: both are prefixes of the ranking


def _removed_outside(idx: torch.Tensor, keep: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[F, vocab]`` True except at the first ``keep`` of the ranked token ids ``idx``."""
    kept = torch.arange(idx.shape[1], device=idx.device).unsqueeze(0) < keep.unsqueeze(1)  # [F, C]
    remove = torch.ones((idx.shape[0], vocab), dtype=torch.bool, device=idx.device)
    return remove.scatter_(1, idx, ~kept)
