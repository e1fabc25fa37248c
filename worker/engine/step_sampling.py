"""Turn a step's logits into the tokens each sequence appends: the sampler draws one
token per plain row, the draft verifier checks the rows of sequences with drafts, and
requests with n > 1 fork their other samples from the leader's first row. Grammar masks
are the sampler's ``constrain``: they decide what is drawn, never the logprobs."""

from __future__ import annotations

from collections.abc import Callable

import torch

from worker.engine.sampler import Sampler
from worker.engine.sequence import Sequence
from worker.engine.speculation import verify_drafts
from worker.engine.step_plan import SampledTokens, ScheduledSequence, SchedulerOutput
from worker.engine.structured import grammar_masks

# Called with each plainly sampled sequence and its logits row ``[vocab]`` (no grammar
# mask in it: each forked sample applies its own grammar's): the samples it forks (empty for all but the first token of an n > 1 request).
Forker = Callable[[ScheduledSequence, torch.Tensor], list[SampledTokens]]


def sample_step(
    plan: SchedulerOutput, logits: torch.Tensor, sampler: Sampler, fork: Forker
) -> tuple[list[SampledTokens], int, list[tuple[Sequence, str]]]:
    """What every sampling sequence of ``plan`` appends, given ``logits`` ``[rows, vocab]``
    laid out as ``plan.logits_rows``; how many drafts were accepted; and the sequences whose
    row the sampler refused (non-finite logits, a bad bias), with its reason: they append
    nothing and fail alone."""
    owners = plan.logits_rows.owners
    plain = [(s, row) for s, row in owners if not s.num_draft_tokens]
    drafted = [(s, row) for s, row in owners if s.num_draft_tokens]
    results: list[SampledTokens] = []
    failed: list[tuple[Sequence, str]] = []
    if plain:
        rows = [row for _, row in plain]
        plain_logits = logits if len(rows) == logits.shape[0] else logits[rows]  # [num_plain, vocab]
        constrained = [(i, s.seq.grammar) for i, (s, _) in enumerate(plain)
                       if s.seq.grammar is not None]
        drawn = sampler.sample(plain_logits, [s.seq for s, _ in plain],
                               constrain=grammar_masks(constrained))
        for i, (s, _) in enumerate(plain):
            error = drawn.errors[i] if drawn.errors else None
            if error:
                failed.append((s.seq, error))
                continue
            results.append(SampledTokens(s.seq, [(drawn.token_ids[i], drawn.logprobs[i])]))
            results.extend(fork(s, plain_logits[i]))
        if constrained:  # forked samples of a constrained request are constrained too
            results = _advance_grammars(results, failed)
    num_accepted = 0
    if drafted:
        verified, num_accepted, refused = verify_drafts(drafted, logits)
        results.extend(verified)
        failed.extend(refused)
    return results, num_accepted, failed


def _advance_grammars(
    results: list[SampledTokens], failed: list[tuple[Sequence, str]]
) -> list[SampledTokens]:
    """Move each constrained sequence's grammar past its new token; one the grammar refuses
    (it cannot happen with the mask applied, unless the row was unusable) fails alone."""
    kept = []
    for r in results:
        grammar = r.seq.grammar
        if grammar is not None and not all(grammar.accept(t) for t, _ in r.tokens):
            failed.append((r.seq, "the structured output grammar refused the sampled token"))
            continue
        kept.append(r)
    return kept
