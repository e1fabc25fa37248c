"""Turn a step's logits into the tokens each sequence appends: the sampler draws one
token per plain row (and the first token of each sample the scheduler forked for an
n > 1 request, from its leader's row), and the draft verifier checks the rows of
sequences with drafts. Grammar masks are the sampler's ``constrain``: they decide what is
drawn, never the logprobs."""

from __future__ import annotations

import torch

from worker.engine.sampler import Sampler
from worker.engine.sequence import Sequence
from worker.engine.speculation import verify_drafts
from worker.engine.step_plan import SampledStep, SampledTokens, SchedulerOutput
from worker.engine.structured import grammar_masks


def sample_step(
    plan: SchedulerOutput, logits: torch.Tensor | None, sampler: Sampler,
    forks: list[tuple[Sequence, int]],
) -> SampledStep:
    """What every sampling sequence of ``plan`` appends, given ``logits`` ``[rows, vocab]``
    laid out as ``plan.logits_rows`` (None: nothing ran). ``forks`` are the forked samples
    and their leader's logits row, sampled after the plan's rows in the same batch. A row the sampler refuses (non-finite logits, a bad bias) appends nothing and its
    sequence fails alone."""
    owners = plan.logits_rows.owners
    out = SampledStep()
    if logits is None or not owners:
        return out
    drafted = [(s, row) for s, row in owners if s.num_draft_tokens]
    plain = [(s.seq, row) for s, row in owners if not s.num_draft_tokens]
    if forks:
        plain += forks
    if plain:
        rows = [row for _, row in plain]
        seqs = [seq for seq, _ in plain]
        # the plan's rows in order (one each, no prompt rows) are the whole tensor
        plain_logits = logits if len(rows) == logits.shape[0] and not forks else logits[rows]  # [num_plain, vocab]
        constrained = [(i, seq.grammar) for i, seq in enumerate(seqs) if seq.grammar is not None]
        drawn = sampler.sample(plain_logits, seqs, constrain=grammar_masks(constrained))
        for i, seq in enumerate(seqs):
            error = drawn.errors[i] if drawn.errors else None
            if error:
                out.failed.append((seq, error))
                continue
            out.tokens.append(SampledTokens(seq, [(drawn.token_ids[i], drawn.logprobs[i])]))
        if constrained:
            out.tokens = _advance_grammars(out.tokens, out.failed)
    if drafted:
        verified, out.num_accepted, refused = verify_drafts(drafted, logits)
        out.tokens.extend(verified)
        out.failed.extend(refused)
    return out


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
