"""When a sequence stops, and the text it ends with (vLLM semantics).

``StopChecker.decide`` runs after each new token is appended to a sequence (the
scheduler's ``update_from_output`` calls it; ``check`` is the same rule on bare values):

- once ``len(output) >= min_tokens``: an eos token (unless ``ignore_eos``) ends it with
  ``"stop"`` (``stop_reason`` None), a token of ``stop_token_ids`` with ``"stop"``
  (``stop_reason`` the id), a stop string with ``"stop"`` (``stop_reason`` the string,
  ``text`` the output text cut before it, OpenAI style);
- otherwise ``max_tokens`` output tokens, or ``prompt_len + len(output) >= max_model_len``,
  end it with ``"length"`` (also while under min_tokens: the context cannot grow).

A stop on the same token as a length limit reports ``"stop"``. Stop strings are looked
for only in text the newest token produced, decoding a short tail window of the output
rather than all of it, with one automaton for all of a request's stop strings: the work
per token grows with the new text and the longest stop string, not with the output or
the number of stop strings. Requests without stop strings cost no tokenizer work at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from worker.engine.stop_matcher import MatcherCache
from worker.protocol.sampling_params import SamplingParams

if TYPE_CHECKING:
    from worker.engine.sequence import Sequence

_REPLACEMENT = "\ufffd"  # what a decode shows for bytes of a not yet complete character
# Extra characters wanted in the decoded context before the new token, beyond the
# longest stop string, to cover decode artifacts at the window start (a stripped
# leading space, replacement characters of a cut multi-byte character).
_CONTEXT_SLACK = 2
# The tail window grows (doubling) while its text is shorter than the longest stop
# string, up to this many tokens per character wanted: tokens that decode to nothing
# (skipped special tokens) cannot make one check cost the whole output.
_MAX_TOKENS_PER_CHAR = 8


class Detokenizer(Protocol):
    """The part of a Hugging Face tokenizer the checker uses."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str | list[str]:
        """Text of ``token_ids`` (a list of ids gives one string)."""
        ...


# A stop: (finish_reason "stop" | "length", stop_reason, text cut before a stop string)
Stop = tuple[str, str | int | None, str | None]


@dataclass
class StopDecision:
    """Outcome of one check: ``finish_reason`` None means keep going."""

    finish_reason: str | None  # "stop" | "length" | None
    stop_reason: str | int | None  # the matched stop string or stop token id; None for eos / length
    text: str | None  # stop strings only: the output text cut before the stop string

    @property
    def finished(self) -> bool:
        """True when the sequence must stop now."""
        return self.finish_reason is not None


def _common_prefix_len(a: str, b: str) -> int:
    if b.startswith(a):
        return len(a)
    n = 0
    for ca, cb in zip(a, b, strict=False):
        if ca != cb:
            break
        n += 1
    return n


class StopChecker:
    """Decides after every new token whether a sequence is finished (see module doc)."""

    def __init__(self, *, tokenizer: Detokenizer, eos_token_ids: set[int], max_model_len: int):
        """``tokenizer`` decodes output tokens (only for stop strings and final text)."""
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len
        self._matchers = MatcherCache()

    def check(
        self, *, prompt_len: int, output_token_ids: list[int], params: SamplingParams
    ) -> StopDecision:
        """Decide whether the sequence stops after its newest token ``output_token_ids[-1]``."""
        stop = self._decide(prompt_len, output_token_ids, params, params.max_tokens)
        return StopDecision(None, None, None) if stop is None else StopDecision(*stop)

    def decide(self, seq: Sequence) -> Stop | None:
        """Whether ``seq`` ends after its newest token: ``(finish_reason, stop_reason, text)``
        when it does, as ``check`` decides but against ``seq.max_tokens`` (``max_tokens``
        resolved to the context when the request left it out); None to go on."""
        output, params = seq.output_token_ids, seq.params
        num_output = len(output)
        if (num_output < seq.max_tokens and len(seq.token_ids) < self.max_model_len
                and (num_output < params.min_tokens
                     or ((params.ignore_eos or output[-1] not in self.eos_token_ids)
                     and not params.stop_token_ids and not params.stop))):
            return None  # the common case, decided without the general rule's calls
        return self._decide(len(seq.prompt_token_ids), output, params, seq.max_tokens)

    def final_text(self, output_token_ids: list[int], params: SamplingParams) -> str:
        """Detokenized output at finish, honouring ``skip_special_tokens``.

        A last token that stopped the sequence (eos unless ``ignore_eos``, or one of
        ``stop_token_ids``, once min_tokens is reached) is not part of the text. For a
        stop-string finish use ``StopDecision.text``, which is already cut.
        """
        ids = output_token_ids
        if ids and len(ids) >= params.min_tokens:
            last = ids[-1]
            if (
                not params.ignore_eos and last in self.eos_token_ids
            ) or last in params.stop_token_ids:
                ids = ids[:-1]
        return self._decode(ids, params.skip_special_tokens)

    # ---------------------------------------------------------------- internal

    def _decide(
        self, prompt_len: int, output_token_ids: list[int], params: SamplingParams, max_tokens: int | None
    ) -> Stop | None:
        num_output = len(output_token_ids)
        if num_output and num_output >= params.min_tokens:
            last = output_token_ids[-1]
            if not params.ignore_eos and last in self.eos_token_ids:
                return "stop", None, None
            if last in params.stop_token_ids:
                return "stop", last, None
            if params.stop:
                match = self._match_stop_string(output_token_ids, params)
                if match is not None:
                    return "stop", match[0], match[1]
        if max_tokens is not None and num_output >= max_tokens:
            return "length", None, None
        if prompt_len + num_output >= self.max_model_len:
            return "length", None, None
        return None

    def _decode(self, token_ids: list[int], skip_special_tokens: bool) -> str:
        text = self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)
        if not isinstance(text, str):
            raise TypeError(f"tokenizer.decode gave {type(text).__name__} for one sequence")
        return text

    def _match_stop_string(
        self, output_token_ids: list[int], params: SamplingParams
    ) -> tuple[str, str] | None:
        """(stop string, text cut before it) when the newest token completes a stop
        string, else None. Decodes a tail window of tokens only: wide enough that the
        text before the newest token holds the longest stop string (widened, doubling,
        when tokens decode to few characters, e.g. the bytes of one character)."""
        skip = params.skip_special_tokens
        matcher = self._matchers.get(params.stop)
        longest = max(len(s) for s in params.stop)
        num = len(output_token_ids)
        context = min(num - 1, longest + _CONTEXT_SLACK)  # tokens before the newest one
        widest = min(num - 1, _MAX_TOKENS_PER_CHAR * (longest + _CONTEXT_SLACK))
        while True:
            window = output_token_ids[num - 1 - context :]
            before = self._decode(window[:-1], skip)
            if context >= widest or len(before.lstrip(_REPLACEMENT)) >= longest + _CONTEXT_SLACK:
                break
            context = min(widest, 2 * context)
        after = self._decode(window, skip)

        # Characters of ``after`` past ``known`` are new (or changed: a character the
        # previous token had left incomplete). A match must end among them.
        known = _common_prefix_len(before, after)
        start = max(0, known - longest + 1)  # earlier characters cannot be in a match
        match = matcher.earliest(after[start:], end_from=known - start)
        if match is None:
            return None
        index, stop = match[0] + start, match[1]

        full = self._decode(output_token_ids, skip)
        tail = after[index:]  # the stop string and what follows it
        if full.endswith(tail):
            return stop, full[: len(full) - len(tail)]
        # The window decoded differently from the full text (should not happen once
        # ``before`` is long enough); fall back on a search of the full text.
        fallback = matcher.earliest(full)
        if fallback is None:
            return stop, full
        return fallback[1], full[: fallback[0]]
