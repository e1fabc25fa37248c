"""Prompt logprobs (vLLM's ``prompt_logprobs``): for each prompt token after the first,
its log-probability given the tokens before it, its rank, and the top alternatives.

The plan asks the model for logits at the rows that predict prompt tokens
(``ScheduledSequence.prompt_logprob_positions``), beside the rows that sample; this module
turns those rows into entries of ``Sequence.prompt_logprobs``. Scores are ``log_softmax``
of the raw logits in float32 (no penalty, bias or temperature: nothing was sampled there).
"""

from __future__ import annotations

import torch

from worker.engine.outputs import TokenLogprob
from worker.engine.step_plan import SchedulerOutput

ROWS_PER_SLICE = 256  # bounds the float32 copy: [256, vocab] at a time


def record_prompt_logprobs(plan: SchedulerOutput, logits: torch.Tensor) -> None:
    """Append this step's prompt scores to each scoring sequence; ``logits`` is
    ``[rows, vocab]`` laid out as ``plan.logits_rows``."""
    for s, first_row, positions in plan.logits_rows.prompt_rows:
        seq = s.seq
        assert seq.prompt_logprobs is not None
        top_n = seq.params.prompt_logprobs or 0
        for lo in range(0, len(positions), ROWS_PER_SLICE):
            part = positions[lo : lo + ROWS_PER_SLICE]
            rows = logits[first_row + lo : first_row + lo + len(part)].float()  # [P, vocab]
            scores = torch.log_softmax(rows, dim=-1)  # [P, vocab]
            targets = torch.tensor(
                [seq.token_ids[p + 1] for p in part], dtype=torch.long, device=scores.device
            )  # [P]: the prompt token each row predicts
            chosen = scores.gather(1, targets.unsqueeze(1))  # [P, 1]
            ranks = (scores > chosen).sum(dim=1) + 1  # [P]
            top = torch.topk(scores, top_n, dim=-1) if top_n else None  # values, ids [P, k]
            seq.prompt_logprobs.extend(
                _entry(
                    int(targets[i]),
                    float(chosen[i, 0]),
                    int(ranks[i]),
                    None if top is None else (top.values[i].tolist(), top.indices[i].tolist()),
                )
                for i in range(len(part))
            )


def _entry(
    token: int, logprob: float, rank: int, top: tuple[list[float], list[int]] | None
) -> TokenLogprob:
    alternatives = {} if top is None else dict(zip(top[1], top[0], strict=True))
    return TokenLogprob(token_id=token, logprob=logprob, top=alternatives, rank=rank)
