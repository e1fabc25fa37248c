"""Structured output in the engine: grammars compiled by xgrammar, a matcher per sequence,
token masks applied to the constrained rows of a step's logits.

xgrammar is what vLLM and SGLang use: it compiles a JSON schema, a regular expression or a
choice list into a grammar over the tokenizer's vocabulary, and a matcher per sequence
fills a bitmask of the tokens that keep the output valid. Masks are filled only for the
constrained rows of a step and applied by the sampler to those rows of its copy of the
batched logits (its logprobs come from the logits before the mask: they describe the
model, not the grammar); free rows are not touched. Compiled grammars are cached by their normalized spec. The
library is imported on the first constrained request, so an engine that never sees one
never loads it.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable
from typing import Any

import torch

from worker.protocol.sampling_params import InvalidRequestError
from worker.protocol.structured_output import choice_pattern, param_of

CACHE_SIZE = 256  # compiled grammars kept, by spec
_LIBRARY_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: ")


class Grammar:
    """One sequence's position in its grammar."""

    def __init__(self, compiled: Any) -> None:
        import xgrammar as xgr

        self._compiled = compiled
        self.matcher = xgr.GrammarMatcher(compiled)

    def fresh(self) -> Grammar:
        """A matcher of the same grammar at its start (for a forked sample)."""
        return Grammar(self._compiled)

    def accept(self, token_id: int) -> bool:
        """Advance past ``token_id``; False when the grammar does not allow it."""
        return bool(self.matcher.accept_token(token_id))


class Grammars:
    """The engine's grammar compiler (built on first use) and its cache."""

    def __init__(self, tokenizer: Any, *, vocab_size: int, eos_token_ids: Iterable[int]) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)

    @functools.cached_property
    def _info(self) -> Any:
        import xgrammar as xgr

        return xgr.TokenizerInfo.from_huggingface(
            self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.eos_token_ids
        )

    @functools.cached_property
    def _compiler(self) -> Any:
        import xgrammar as xgr

        return xgr.GrammarCompiler(self._info, max_threads=1)

    def grammar_for(self, spec: dict[str, Any], compiled: Any | None = None) -> Grammar:
        """A fresh matcher for ``spec`` (normalized, see ``worker.protocol.structured_output``);
        InvalidRequestError with the library's reason when it cannot be compiled.
        ``compiled``: the grammar compiled already (:meth:`compiled`, by the worker's intake
        after a bounded check), so this thread compiles nothing."""
        return Grammar(compiled if compiled is not None else self.compiled(spec))

    def compiled(self, spec: dict[str, Any]) -> Any:
        """The compiled grammar of ``spec`` (cached); InvalidRequestError when the library
        refuses it. Not time-bounded by itself: the worker calls it off the engine thread,
        only for a spec ``worker.engine.grammar_service`` compiled within its bound."""
        return self._compiled(json.dumps(spec, sort_keys=True))

    def tokenizer_info_json(self) -> str:
        """The vocabulary as xgrammar sees it (``TokenizerInfo.serialize_json``), for the
        grammar helper process to compile against the same tokens."""
        return str(self._info.serialize_json())

    @functools.lru_cache(maxsize=CACHE_SIZE)  # noqa: B019 (one engine, one cache)
    def _compiled(self, key: str) -> Any:
        spec = json.loads(key)
        grammar = grammar_of(spec)
        try:
            return self._compiler.compile_grammar(grammar)
        except (RuntimeError, ValueError) as exc:
            raise refused(spec, exc) from None


_ANY_OBJECT = json.dumps({"type": "object"})  # strict_mode off: any properties


def grammar_of(spec: dict[str, Any]) -> Any:
    """The xgrammar ``Grammar`` of a normalized constraint (no tokenizer needed: what the
    API's submission check builds too); InvalidRequestError with the library's reason
    when it cannot be built."""
    import xgrammar as xgr

    kind = spec.get("type")
    try:
        if kind == "json_schema":
            return xgr.Grammar.from_json_schema(json.dumps(spec["schema"]), any_whitespace=False)
        if kind == "json_object":  # OpenAI's JSON mode: an object, not any JSON value
            return xgr.Grammar.from_json_schema(_ANY_OBJECT, any_whitespace=True,
                                                strict_mode=False)
        if kind == "regex":
            return xgr.Grammar.from_regex(spec["pattern"])
        if kind == "choice":
            return xgr.Grammar.from_regex(choice_pattern(spec["choices"]))
    except (RuntimeError, ValueError) as exc:
        raise refused(spec, exc) from None
    raise InvalidRequestError(f"unknown structured output type {kind!r}", param=param_of(spec))


def refused(spec: dict[str, Any], exc: Exception) -> InvalidRequestError:
    param = param_of(spec)
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    reason = _LIBRARY_PREFIX.sub("", reason)  # "[hh:mm:ss] source.cc:94: " of its log lines
    return InvalidRequestError(
        f"{param}: the grammar library cannot compile it: {reason}", param=param)


def grammar_masks(rows: list[tuple[int, Grammar]]) -> Callable[[torch.Tensor], None] | None:
    """The sampler's ``constrain`` for the constrained ``(row, grammar)`` of a batch: it
    applies :func:`apply_masks` to the logits it is given; None when no row is constrained."""
    if not rows:
        return None
    return functools.partial(apply_masks, rows=rows)


def apply_masks(logits: torch.Tensor, rows: list[tuple[int, Grammar]]) -> None:
    """Set to -inf, in place, every token the grammar of each ``(row, grammar)`` forbids
    next; ``logits`` ``[R, vocab]``. Rows not listed are left as they are."""
    if not rows:
        return
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(len(rows), logits.shape[-1])  # [C, ceil(vocab / 32)]
    for i, (_, grammar) in enumerate(rows):
        grammar.matcher.fill_next_token_bitmask(bitmask, i)
    index = [r for r, _ in rows]
    with torch.inference_mode():  # the step's logits are inference tensors
        sub = logits[index].float()  # [C, vocab]: a copy, masked, then written back
        xgr.apply_token_bitmask_inplace(sub, bitmask)
        logits[index] = sub.to(logits.dtype)
