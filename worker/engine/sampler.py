"""Token sampling for one engine step, vectorized across the rows of the batch.

Per row, in this order:

1. penalties (only rows that ask for them): repetition penalty over prompt + output
   tokens (HF/CTRL: positive logits divided, negative ones multiplied), then presence and
   frequency penalties over output tokens (OpenAI: ``logit -= presence * (count > 0) +
   frequency * count``);
2. min_tokens: while ``len(output) < min_tokens`` the eos ids and the request's
   ``stop_token_ids`` are set to ``-inf`` (also with ``ignore_eos``);
3. greedy rows (``temperature < 1e-5``): the argmax of the logits after 1-2 (the first
   index of the row's maximum, ``max_per_row`` of ``kernels.cpu_fused``: native rows in
   parallel for fp32 on the CPU, else ``torch.max``), so ties go to the lowest token id
   exactly like Hugging Face ``generate``;
4. other rows: temperature, top-k, top-p, min-p (in that order, as Hugging Face applies
   its warpers), then one draw by exponential race, ``argmax(probs / E)`` with
   ``E ~ Exponential(1)`` over the full vocabulary. A seeded row draws its ``E`` from its
   own generator, so its tokens do not depend on what else is in the batch; unseeded
   rows share the sampler's generator.

``logit_bias`` is added in step 1, after the penalties. A row whose logits are not
usable (a NaN, +inf, or every token at -inf), before or after the temperature, gets no
token: its entry in ``SamplerOutput.errors`` says why, and the other rows are sampled as
usual (the engine fails that request alone).

A structured-output grammar's mask (``constrain``, set to -inf what the grammar forbids
next) applies after 1-2 and decides which tokens can be drawn; it is not part of the
logprobs.

Logprobs are ``log_softmax`` of the logits after 1-2 (penalties and the min_tokens mask)
and before the grammar mask, temperature, top-k, top-p and min-p: the model's own
distribution, as vLLM reports it under a grammar. Every value is finite: one that is
-inf (a token the min_tokens mask removes) or NaN is reported as ``LOGPROB_FLOOR``
(-9999.0, OpenAI's stand-in for an impossible token), so results are valid JSON.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from kernels.cpu_fused import ops_for
from worker.engine.logit_adjust import apply_penalties_and_masks, needs_penalties
from worker.engine.outputs import TokenLogprob
from worker.engine.rank_filter import NUM_CANDIDATES, rank_filter_mask
from worker.engine.sampling_input import SamplingInput
from worker.protocol.openai_output import LOGPROB_FLOOR
from worker.protocol.sampling_params import SamplingParams

# Below this temperature a row is sampled greedily (dividing by it would overflow).
GREEDY_TEMPERATURE_EPS = 1e-5


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator | None:
    """Return a generator on ``device`` seeded with ``seed``, or None when ``seed`` is None.

    The engine calls this once per request when the request is added; any Python int is
    accepted (reduced modulo 2**64, the range ``manual_seed`` takes).
    """
    if seed is None:
        return None
    generator = torch.Generator(device=torch.device(device))
    generator.manual_seed(seed % (1 << 64))
    return generator


@dataclass
class SamplerOutput:
    """The sampled token of each row and, where asked, its logprobs."""

    token_ids: list[int]  # one per row (meaningless where errors[i] is set)
    logprobs: list[TokenLogprob | None]  # None where params.logprobs is None
    errors: list[str | None] = field(default_factory=list)  # per row: why it got no token


NON_FINITE_ERROR = (
    "the model's logits for this request became non-finite (NaN or infinite) or masked "
    "every token; it was stopped alone"
)


def argmax_and_unusable(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass over ``logits`` ``[R, V]``: ``[R]`` the first index of each row's maximum
    (the greedy token) and ``[R]`` bool, rows with a NaN, a +inf, or no finite value at all
    (the row maximum is NaN when any entry is, +inf with one, -inf when all are masked).
    fp32 CPU rows take the native ``max_per_row`` (rows in parallel), the rest ``torch.max``."""
    row_max, row_argmax = ops_for(logits.device, logits.dtype).max_per_row(logits)
    return row_argmax, ~torch.isfinite(row_max)


def is_greedy(params: SamplingParams) -> bool:
    """Whether rows with these params take the argmax."""
    return params.temperature < GREEDY_TEMPERATURE_EPS


def _is_plain_greedy(row: SamplingInput) -> bool:
    """A greedy row with nothing to adjust (penalties, bias, the min_tokens ban) and no
    logprobs: its token is its logits' argmax."""
    p = row.params
    return (p.temperature < GREEDY_TEMPERATURE_EPS and p.logprobs is None
            and len(row.output_token_ids) >= p.min_tokens and not needs_penalties(p))


class Sampler:
    """Turns the last-token logits of a batch into one token per row (see module doc)."""

    def __init__(self, *, eos_token_ids: set[int], device: torch.device | str, seed: int = 0):
        """``eos_token_ids`` are masked under min_tokens; ``seed`` seeds the generator
        that unseeded rows share."""
        self.eos_token_ids = frozenset(eos_token_ids)
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed % (1 << 64))

    # ------------------------------------------------------------------ public

    def sample(
        self,
        logits: torch.Tensor,
        rows: Sequence[SamplingInput],
        *,
        constrain: Callable[[torch.Tensor], None] | None = None,
    ) -> SamplerOutput:
        """Sample one token per row.

        ``logits`` is ``[num_rows, vocab]`` (float32; other float dtypes are upcast), row
        ``i`` belonging to ``rows[i]``. The input tensor is never modified. ``constrain``
        (structured output) sets to -inf, in place, the tokens each row's grammar forbids;
        it is given a copy of the logits after the penalties, and the logprobs are taken
        before it. Raises ValueError on a bad shape, dtype or device.
        """
        self._check_inputs(logits, rows)
        logits = logits.float()  # [R, V]; no copy when already float32
        if constrain is None and all(map(_is_plain_greedy, rows)):
            return self._plain_greedy(logits)
        errors = self._bias_errors(rows, logits.shape[1])
        logits = apply_penalties_and_masks(logits, rows, self.eos_token_ids)  # a copy if anything changed
        scored = logits  # [R, V]: what the logprobs describe (the grammar mask is not in it)
        if constrain is not None:
            logits = logits.clone()  # [R, V]
            constrain(logits)
        row_argmax, bad = argmax_and_unusable(logits)  # [R]: a greedy row's token; [R] bool
        if any(errors):  # rows refused on the host fail too
            bad = bad.clone()
            bad[self._index([i for i, e in enumerate(errors) if e], logits.device)] = True

        greedy = [is_greedy(row.params) for row in rows]
        if all(greedy):
            tokens = row_argmax  # [R] (a failed row's is unused)
        else:
            # a failed row is sampled as a uniform row, its token discarded (a new tensor:
            # never write into the caller's); no synchronisation with the device here
            logits = torch.where(bad.unsqueeze(1), 0.0, logits)  # [R, V]
            tokens = row_argmax.clone()  # [R]: the greedy rows' tokens stay
            sampled_rows = [i for i, g in enumerate(greedy) if not g]
            s_idx = self._index(sampled_rows, logits.device)  # [S]
            drawn, late_bad = self._sample_rows(logits[s_idx], [rows[i] for i in sampled_rows])
            tokens[s_idx] = drawn
            bad = bad.clone()
            bad[s_idx] |= late_bad
        # the one wait on the device: the tokens, a failed row's as -1
        token_ids = torch.where(bad, -1, tokens).tolist()
        for i, token in enumerate(token_ids):
            if token < 0:
                errors[i] = errors[i] or NON_FINITE_ERROR
        return SamplerOutput(
            token_ids=token_ids,
            logprobs=self._logprobs(scored, rows, tokens),
            errors=errors,
        )

    def _plain_greedy(self, logits: torch.Tensor) -> SamplerOutput:
        """Every row greedy with nothing to adjust and no logprobs (``_is_plain_greedy``):
        the argmax of each row, one transfer of the tokens (an unusable row's as -1)."""
        row_argmax, bad = argmax_and_unusable(logits)  # [R] each
        token_ids = torch.where(bad, -1, row_argmax).tolist()
        errors: list[str | None] = [NON_FINITE_ERROR if t < 0 else None for t in token_ids]
        return SamplerOutput(token_ids=token_ids, logprobs=[None] * len(token_ids), errors=errors)

    def _bias_errors(self, rows: Sequence[SamplingInput], vocab: int) -> list[str | None]:
        """Per row, an error when its logit_bias names a token outside the vocabulary."""
        errors: list[str | None] = [None] * len(rows)
        for i, row in enumerate(rows):
            outside = [t for t in (row.params.logit_bias or {}) if not 0 <= t < vocab]
            if outside:
                errors[i] = (
                    f"logit_bias names token id {outside[0]}, outside this model's "
                    f"vocabulary of {vocab} tokens"
                )
        return errors

    # ---------------------------------------------------------------- internal

    def _check_inputs(self, logits: torch.Tensor, rows: Sequence[SamplingInput]) -> None:
        if not isinstance(logits, torch.Tensor):
            raise ValueError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
        if logits.dim() != 2:
            raise ValueError(f"logits must be [num_rows, vocab], got shape {tuple(logits.shape)}")
        if logits.shape[0] != len(rows):
            raise ValueError(
                f"logits have {logits.shape[0]} rows but {len(rows)} sequences were given"
            )
        if logits.shape[1] == 0:
            raise ValueError("logits have an empty vocabulary dimension")
        if not logits.is_floating_point():
            raise ValueError(f"logits must be floating point, got {logits.dtype}")
        if logits.device.type != self.device.type:
            raise ValueError(f"logits are on {logits.device}, the sampler on {self.device}")

    @staticmethod
    def _index(positions: list[int], device: torch.device) -> torch.Tensor:
        return torch.tensor(positions, dtype=torch.long, device=device)

    def _sample_rows(
        self, logits: torch.Tensor, rows: Sequence[SamplingInput]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample one token for each non-greedy row; ``logits`` is ``[S, V]``. Returns the
        ``[S]`` tokens and ``[S]`` bool, the rows the temperature made unusable."""
        num, vocab = logits.shape
        device = logits.device
        params = [row.params for row in rows]

        temperature = torch.tensor(
            [p.temperature for p in params], dtype=torch.float32, device=device
        ).unsqueeze(1)  # [S, 1]
        x = logits / temperature  # [S, V]
        late_bad = argmax_and_unusable(x)[1]  # [S]
        x = torch.where(late_bad.unsqueeze(1), 0.0, x)  # [S, V]: a uniform row, its token discarded

        ranked = [i for i, p in enumerate(params) if 0 < p.top_k < vocab or p.top_p < 1.0]
        if ranked:
            every_row = len(ranked) == num
            r_idx = None if every_row else self._index(ranked, device)  # [F]
            sub = x if r_idx is None else x[r_idx]  # [F, V]
            remove = rank_filter_mask(
                sub,
                [params[i].top_k for i in ranked],
                [params[i].top_p for i in ranked],
                num_candidates=NUM_CANDIDATES if device.type == "cpu" else None,
            )  # [F, V]
            sub = sub.masked_fill(remove, float("-inf"))
            if r_idx is None:
                x = sub
            else:
                x[r_idx] = sub

        if any(p.min_p > 0.0 for p in params):
            probs = torch.softmax(x, dim=-1)  # [S, V]
            min_p = torch.tensor(
                [p.min_p for p in params], dtype=torch.float32, device=device
            ).unsqueeze(1)  # [S, 1]
            x = x.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))

        probs = torch.softmax(x, dim=-1)  # [S, V]
        noise = self._exponential_noise(rows, num, vocab, device)  # [S, V]
        return (probs / noise).argmax(dim=-1), late_bad  # [S]

    def _exponential_noise(
        self, rows: Sequence[SamplingInput], num: int, vocab: int, device: torch.device
    ) -> torch.Tensor:
        """``[num, vocab]`` Exponential(1) draws: each seeded row's from its own generator
        (one full-vocabulary draw per sampled token), the others from the shared one."""
        noise = torch.empty((num, vocab), dtype=torch.float32, device=device)  # [S, V]
        unseeded = [i for i, row in enumerate(rows) if row.generator is None]
        if len(unseeded) == num:
            noise.exponential_(generator=self.generator)
        elif unseeded:
            draws = torch.empty((len(unseeded), vocab), dtype=torch.float32, device=device)
            noise[self._index(unseeded, device)] = draws.exponential_(generator=self.generator)
        for i, row in enumerate(rows):
            if row.generator is not None:
                noise[i].exponential_(generator=row.generator)  # [V] view, contiguous
        # A zero draw would turn 0/0 into NaN, which argmax would pick.
        return noise.clamp_min_(torch.finfo(torch.float32).tiny)

    def _logprobs(
        self, logits: torch.Tensor, rows: Sequence[SamplingInput], tokens: torch.Tensor
    ) -> list[TokenLogprob | None]:
        """Logprob of each chosen token and the top-n, for rows with params.logprobs set;
        ``logits`` ``[R, V]`` are the scores before the grammar mask. Non-finite values
        become ``LOGPROB_FLOOR``."""
        result: list[TokenLogprob | None] = [None] * len(rows)
        wanted = [i for i, row in enumerate(rows) if row.params.logprobs is not None]
        if not wanted:
            return result
        w_idx = self._index(wanted, logits.device)  # [W]
        logprobs = torch.log_softmax(logits[w_idx], dim=-1)  # [W, V]
        logprobs = logprobs.nan_to_num(nan=LOGPROB_FLOOR, neginf=LOGPROB_FLOOR).clamp_min(
            LOGPROB_FLOOR
        )  # [W, V]: finite (a masked token is -inf; a failed row's are NaN)
        chosen_t = tokens[w_idx]  # [W]
        chosen_lp = logprobs.gather(1, chosen_t.unsqueeze(1)).squeeze(1)  # [W]
        top_n = min(max(rows[i].params.logprobs or 0 for i in wanted), logprobs.shape[1])
        top_vals: list[list[float]] = [[] for _ in wanted]
        top_ids: list[list[int]] = [[] for _ in wanted]
        if top_n > 0:
            vals, ids = torch.topk(logprobs, top_n, dim=-1)  # [W, n] each, best first
            top_vals, top_ids = vals.tolist(), ids.tolist()
        for j, (i, token, lp) in enumerate(
            zip(wanted, chosen_t.tolist(), chosen_lp.tolist(), strict=True)
        ):
            n = rows[i].params.logprobs or 0
            top = dict(zip(top_ids[j][:n], top_vals[j][:n], strict=True))
            result[i] = TokenLogprob(token_id=token, logprob=lp, top=top)
        return result
