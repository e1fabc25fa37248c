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
from worker.engine.step_plan import SampledStep, ScheduledSequence, SchedulerOutput
from worker.engine.structured import Grammar, grammar_masks


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
    drafted: list[tuple[ScheduledSequence, int]] = []
    if not plan.num_draft_tokens and not forks and len(owners) == logits.shape[0]:
        seqs = [s.seq for s, _ in owners]  # one row each, in order: the whole tensor
        plain_logits = logits  # [num_plain, vocab]
    else:
        drafted = [(s, row) for s, row in owners if s.num_draft_tokens]
        plain = [(s.seq, row) for s, row in owners if not s.num_draft_tokens] + forks
        seqs = [seq for seq, _ in plain]
        plain_logits = logits[[row for _, row in plain]]  # [num_plain, vocab]
    if seqs:
        constrained = [(i, seq.grammar) for i, seq in enumerate(seqs) if seq.grammar is not None]
        drawn = sampler.sample(plain_logits, seqs, constrain=grammar_masks(constrained))
        refused = _refused(seqs, drawn.token_ids, drawn.errors, constrained)
        if not refused:
            out.seqs, out.token_ids, out.logprobs = seqs, drawn.token_ids, drawn.logprobs
        else:
            for i, seq in enumerate(seqs):
                if i in refused:
                    out.failed.append((seq, refused[i]))
                    continue
                out.seqs.append(seq)
                out.token_ids.append(drawn.token_ids[i])
                out.logprobs.append(drawn.logprobs[i])
    if drafted:
        verified, out.num_accepted, failed = verify_drafts(drafted, logits)
        out.tokens.extend(verified)
        out.failed.extend(failed)
    return out


def _refused(seqs: list[Sequence], token_ids: list[int], errors: list[str | None],
             constrained: list[tuple[int, Grammar]]) -> dict[int, str]:
    """Rows that append nothing, and why: the sampler's errors, and the constrained rows
    whose grammar refuses their token (it cannot happen with the mask applied, unless
    the row was unusable); each accepted token moves its grammar on."""
    refused = {i: e for i, e in enumerate(errors) if e} if any(errors) else {}
    for i, grammar in constrained:
        if i not in refused and not grammar.accept(token_ids[i]):
            refused[i] = "the structured output grammar refused the sampled token"
    return refused
