"""Speculative decoding with n-gram drafts, for greedy requests.

Before a step, each eligible decoding sequence gets up to ``k`` draft tokens from its
:class:`~worker.engine.ngram_proposer.NgramIndex`. The scheduler runs the last sampled
token and the drafts as one chunk (``num_computed_tokens`` simply catches up further), the
model returns logits for all of them, and :func:`accept` keeps the drafts the model agrees
with plus the model's own next token. The output is the same greedy output as without
drafts; a step just yields up to ``k + 1`` tokens per sequence.

Drafts cost matmul rows. On a CPU a step's time is a fixed part (streaming the weights)
plus a per-row part, so drafts pay while the batch is small and stop paying once the
matmuls are compute-bound: ``max_rows`` caps decode rows plus drafts per step.
"""

from __future__ import annotations

from collections.abc import Iterable

from worker.engine.ngram_proposer import NgramIndex
from worker.engine.sampler import is_greedy, needs_penalties
from worker.engine.sequence import Sequence


def is_eligible(seq: Sequence) -> bool:
    """Whether drafts can be verified by argmax alone: a greedy sample without penalties,
    logprobs, sibling samples or a pending min_tokens mask, that is decoding now."""
    p = seq.params
    return (
        is_greedy(p)
        and not needs_penalties(p)
        and p.logprobs is None
        and seq.group_id is None
        and seq.num_output_tokens >= max(1, p.min_tokens)
        and seq.num_computed_tokens == seq.num_tokens - 1
    )


def accept(drafts: list[int], targets: list[int]) -> list[int]:
    """The tokens a verified step appends: the longest prefix of ``drafts`` equal to the
    model's argmax ``targets`` (one more than drafts), then the model's next token."""
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == targets[accepted]:
        accepted += 1
    return targets[: accepted + 1]


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
