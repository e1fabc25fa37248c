"""The life of a draft token, start to end: n-gram drafts for greedy requests.

1. **Propose** (before the step): each eligible decoding sequence gets up to ``k`` draft
   tokens from its :class:`~worker.engine.ngram_proposer.NgramIndex`
   (:meth:`NgramSpeculator.propose`); ``max_rows`` caps decode rows plus drafts.
2. **Schedule**: :func:`fit_drafts` keeps the drafts that fit the step's token budget and
   the free KV blocks; a guess never costs another sequence its blocks. The sequence runs
   its last sampled token and the drafts as one chunk (a *verify* row, see
   ``step_plan``), and the model returns one logits row per query token.
3. **Verify** (after the forward, beside the sampler): :func:`verify_drafts` keeps the
   longest prefix of drafts equal to the model's argmax, plus the model's own next token
   (:func:`accept`). The output is the same greedy output as without drafts.
4. **Roll back**: drafts count as computed only once accepted (:func:`settle_accepted`);
   the K/V slots of rejected drafts are simply overwritten by later steps. A preempted
   sequence drops its drafts (:func:`drop_drafts`).

Drafts cost matmul rows. On a CPU a step's time is a fixed part (streaming the weights)
plus a per-row part, so drafts pay while the batch is small and stop paying once the
matmuls are compute-bound.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from worker.engine.block_manager import BlockManager
from worker.engine.logit_adjust import needs_penalties
from worker.engine.ngram_proposer import NgramIndex
from worker.engine.sampler import NON_FINITE_ERROR, argmax_and_unusable, is_greedy
from worker.engine.sequence import Sequence
from worker.engine.step_plan import SampledTokens, ScheduledSequence


def is_eligible(seq: Sequence) -> bool:
    """Whether drafts can be verified by argmax alone: a greedy sample without penalties,
    logprobs, sibling samples or a pending min_tokens mask, that is decoding now."""
    p = seq.params
    return (
        is_greedy(p)
        and not needs_penalties(p)
        and p.logprobs is None
        and p.structured is None
        and seq.group_id is None
        and seq.num_output_tokens >= max(1, p.min_tokens)
        and seq.num_computed_tokens == seq.num_tokens - 1
    )


class NgramSpeculator:
    """Proposes drafts for the running sequences of a step."""

    def __init__(self, *, num_tokens: int, max_rows: int, min_n: int = 2, max_n: int = 4) -> None:
        self.num_tokens = num_tokens
        self.max_rows = max_rows
        self.min_n = min_n
        self.max_n = max_n

    def propose(self, running: Iterable[Sequence]) -> None:
        """Set ``draft_token_ids`` on the running sequences (cleared where none fits)."""
        seqs = list(running)
        budget = self.max_rows - len(seqs)
        eligible = []
        for seq in seqs:
            seq.draft_token_ids = []
            if is_eligible(seq):
                eligible.append(seq)
        # The budget is shared evenly; what one sequence leaves unused goes to the next.
        for i, seq in enumerate(eligible):
            share = budget // (len(eligible) - i)
            room = min(self.num_tokens, share, seq.max_tokens - seq.num_output_tokens - 1)
            if room <= 0:
                continue
            if seq.ngram_index is None:
                seq.ngram_index = NgramIndex(self.min_n, self.max_n)
            seq.draft_token_ids = seq.ngram_index.propose(seq.token_ids, room)
            budget -= len(seq.draft_token_ids)


def fit_drafts(seq: Sequence, budget: int, block_manager: BlockManager) -> int:
    """Query rows a running ``seq`` computes this step (at most ``budget``); drops the
    drafts that do not fit the budget, or all of them when their K/V needs a block that
    is not free."""
    uncomputed = seq.num_tokens - seq.num_computed_tokens
    num_new = min(uncomputed + len(seq.draft_token_ids), budget)
    if seq.draft_token_ids and not block_manager.can_grow(seq, seq.num_computed_tokens + num_new):
        num_new = min(uncomputed, budget)
    del seq.draft_token_ids[max(0, num_new - uncomputed):]
    return num_new


def accept(drafts: list[int], targets: list[int]) -> list[int]:
    """The tokens a verified step appends: the longest prefix of ``drafts`` equal to the
    model's argmax ``targets`` (one more than drafts), then the model's next token."""
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == targets[accepted]:
        accepted += 1
    return targets[: accepted + 1]


def verify_drafts(
    owners: list[tuple[ScheduledSequence, int]], logits: torch.Tensor
) -> tuple[list[SampledTokens], int, list[tuple[Sequence, str]]]:
    """Check the drafts of each ``(scheduled, first logits row)`` against the argmax of its
    ``1 + num_draft_tokens`` rows of ``logits`` ``[rows, vocab]``; returns what each
    appends, how many drafts were accepted in all, and the sequences any of whose rows is
    non-finite (the argmax of a NaN row is meaningless): they append nothing and fail alone,
    as the sampler's own rows do."""
    rows = [r for s, first in owners for r in range(first, first + s.num_logits_rows)]
    verify_logits = logits[rows]  # [num_verify_rows, vocab]
    argmax, unusable_mask = argmax_and_unusable(verify_logits)  # [num_verify_rows] each
    targets, unusable = argmax.tolist(), unusable_mask.tolist()
    results: list[SampledTokens] = []
    failed: list[tuple[Sequence, str]] = []
    num_accepted = 0
    offset = 0
    for s, _ in owners:
        n = s.num_logits_rows
        own_targets, bad = targets[offset : offset + n], any(unusable[offset : offset + n])
        offset += n
        drafts = s.seq.draft_token_ids[: s.num_draft_tokens]
        s.seq.draft_token_ids = []
        if bad:
            failed.append((s.seq, NON_FINITE_ERROR))
            continue
        kept = accept(drafts, own_targets)
        num_accepted += len(kept) - 1
        results.append(SampledTokens(s.seq, [(t, None) for t in kept], s.num_draft_tokens))
    return results, num_accepted, failed


def settle_accepted(seq: Sequence, num_appended: int) -> None:
    """Count the accepted drafts' K/V (computed this step) as computed; the rejected
    ones' slots lie past ``num_computed_tokens`` and are overwritten later."""
    seq.num_computed_tokens += num_appended - 1


def drop_drafts(seq: Sequence) -> None:
    """Forget a sequence's pending drafts (it was preempted)."""
    seq.draft_token_ids = []
