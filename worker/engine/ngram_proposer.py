"""Draft tokens by n-gram lookup in the sequence's own history (prompt-lookup decoding).

When the last ``n`` tokens (``n`` from ``max_n`` down to ``min_n``) occurred earlier in
the prompt or the output, the tokens that followed that earlier occurrence are proposed
as the continuation; the model then checks all of them in one step (see
``worker/engine/speculation.py``). If the match is so recent that fewer than ``k`` tokens
follow it, the continuation repeats with the match's period (a loop ``a b a b`` proposes
``a b a b ...``). The index is incremental: each sequence keeps a map from every n-gram
to where it last ended, updated with the tokens appended since the previous proposal.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class NgramIndex:
    """Where each n-gram of one sequence's tokens last ended (positions < ``indexed_upto``)."""

    min_n: int
    max_n: int
    last_end: dict[tuple[int, ...], int] = field(default_factory=dict)
    indexed_upto: int = 0  # n-grams ending before this position are in ``last_end``

    def update(self, token_ids: list[int]) -> None:
        """Index the n-grams ending at positions ``indexed_upto .. len(token_ids) - 2``.

        The n-grams ending at the last position are left out on purpose: they are the
        suffix the next lookup searches for, so it finds only earlier occurrences.
        """
        stop = len(token_ids) - 1
        for end in range(self.indexed_upto, stop):
            for n in range(self.min_n, self.max_n + 1):
                if end + 1 >= n:
                    self.last_end[tuple(token_ids[end + 1 - n : end + 1])] = end
        self.indexed_upto = max(self.indexed_upto, stop)

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        """Up to ``k`` draft tokens continuing ``token_ids``; empty when no n-gram recurs."""
        if k <= 0:
            return []
        self.update(token_ids)
        last = len(token_ids) - 1
        for n in range(self.max_n, self.min_n - 1, -1):
            if last + 1 < n:
                continue
            end = self.last_end.get(tuple(token_ids[last + 1 - n :]))
            if end is None:
                continue
            period = last - end  # the suffix recurs every `period` tokens
            return [token_ids[end + 1 + (i % period)] for i in range(k)]
        return []
