"""xgrammar against llguidance on this CPU, on our tokenizer and our constraints (issue 16):
the cost of building the tokenizer's index, of compiling each constraint, and of one
token mask per generated token, plus whether each library takes a known-valid output
token by token and refuses a known-invalid one.

xgrammar is a dependency; llguidance is not (install it beside, not into, the project):

    .venv/bin/python -m pip install --no-deps --target .peer/llguidance llguidance
    .venv/bin/python benchmarks/grammar_libraries.py [--model smollm2-135m] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / ".peer" / "llguidance"))

from benchmarks.dataset_features import SCHEMA  # noqa: E402
from cli.bench.machine import cpu_description  # noqa: E402
from worker.protocol.structured_output import choice_pattern  # noqa: E402

# (name, normalized constraint, an output it must take, an output it must refuse)
CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("json schema", {"type": "json_schema", "schema": SCHEMA},
     '{"topic": "science", "difficulty": 3, "needs_followup": false}',
     '{"topic": "sports", "difficulty": 3, "needs_followup": false}'),
    ("json object", {"type": "json_object"},
     '{"a": [1, 2, {"b": null}], "c": "d"}', '{"a": [1, 2,, 3]}'),
    ("regex (ISO date)", {"type": "regex", "pattern": r"\d{4}-\d{2}-\d{2}"},
     "2026-11-30", "2026/11/30"),
    ("choice", {"type": "choice", "choices": ["positive", "negative", "neutral"]},
     "negative", "negatory"),
]


class Xgrammar:
    """The library the engine uses, driven as ``worker.engine.structured`` drives it."""

    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab: int, eos: list[int]) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab,
                                                       stop_token_ids=eos)
        self.vocab = vocab

    def compile(self, spec: dict[str, Any]) -> Any:
        from worker.engine.structured import grammar_of

        compiler = self.xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        return compiler.compile_grammar(grammar_of(spec))

    def matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def mask(self, matcher: Any) -> Callable[[int], bool]:
        bitmask = self.xgr.allocate_token_bitmask(1, self.vocab)  # [1, ceil(vocab / 32)]
        matcher.fill_next_token_bitmask(bitmask, 0)
        return lambda t: bool((int(bitmask[0, t // 32]) >> (t % 32)) & 1)

    def accept(self, matcher: Any, token: int) -> bool:
        return bool(matcher.accept_token(token))

    def fill(self, matcher: Any, bitmask: Any) -> None:
        matcher.fill_next_token_bitmask(bitmask, 0)

    def bitmask(self) -> Any:
        return self.xgr.allocate_token_bitmask(1, self.vocab)


# xgrammar's style with any_whitespace=False, so that both take the same texts
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class Llguidance:
    """The alternative (Microsoft's, used by vLLM as an option), in its own terms."""

    name = "llguidance"

    def __init__(self, tokenizer: Any, vocab: int, eos: list[int]) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.llg, self.llg_torch = llguidance, llguidance.torch
        self.tok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=eos[0])
        self.vocab = vocab

    def compile(self, spec: dict[str, Any]) -> Any:
        m = self.llg.LLMatcher
        kind = spec["type"]
        if kind == "json_schema":
            grammar = m.grammar_from_json_schema(json.dumps(spec["schema"]),
                                                 defaults=JSON_STYLE)
        elif kind == "json_object":
            grammar = m.grammar_from_json_schema('{"type": "object"}',
                                                 defaults=JSON_STYLE)
        elif kind == "regex":
            grammar = m.grammar_from_regex(spec["pattern"])
        else:
            grammar = m.grammar_from_regex(choice_pattern(spec["choices"]))
        matcher = m(self.tok, grammar)  # llguidance builds its parser lazily: first use
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return grammar

    def matcher(self, compiled: Any) -> Any:
        return self.llg.LLMatcher(self.tok, compiled)

    def mask(self, matcher: Any) -> Callable[[int], bool]:
        bitmask = self.llg_torch.allocate_token_bitmask(1, self.vocab)
        self.llg_torch.fill_next_token_bitmask(matcher, bitmask, 0)
        return lambda t: bool((int(bitmask[0, t // 32]) >> (t % 32)) & 1)

    def accept(self, matcher: Any, token: int) -> bool:
        return bool(matcher.consume_token(token)) and not matcher.is_error()

    def fill(self, matcher: Any, bitmask: Any) -> None:
        self.llg_torch.fill_next_token_bitmask(matcher, bitmask, 0)

    def bitmask(self) -> Any:
        return self.llg_torch.allocate_token_bitmask(1, self.vocab)


def walk(lib: Any, compiled: Any, tokens: list[int]) -> tuple[bool, list[float]]:
    """Feed ``tokens`` one by one; True when every one was allowed by the mask before it
    and taken. Also the seconds of each mask fill."""
    matcher, bitmask, fills = lib.matcher(compiled), lib.bitmask(), []
    for token in tokens:
        t0 = time.perf_counter()
        lib.fill(matcher, bitmask)
        fills.append(time.perf_counter() - t0)
        if not (int(bitmask[0, token // 32]) >> (token % 32)) & 1 or not lib.accept(matcher, token):
            return False, fills
    return True, fills


def measure(lib: Any, tokenizer: Any, repeat: int) -> list[dict[str, Any]]:
    """Compile time, per-token mask time and correctness of each case."""
    rows = []
    for name, spec, good, bad in CASES:
        compile_s = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            compiled = lib.compile(spec)
            compile_s.append(time.perf_counter() - t0)
        good_ids = tokenizer.encode(good, add_special_tokens=False)
        bad_ids = tokenizer.encode(bad, add_special_tokens=False)
        fills: list[float] = []
        ok = True
        for _ in range(repeat):
            took, times = walk(lib, compiled, good_ids)
            ok, fills = ok and took, fills + times
        refused, _ = walk(lib, compiled, bad_ids)
        rows.append({"case": name, "compile_ms": statistics.median(compile_s) * 1e3,
                     "mask_us": statistics.median(fills) * 1e6, "tokens": len(good_ids),
                     "takes_valid": ok, "refuses_invalid": not refused})
    return rows


def main() -> None:
    """Print one table per library, measured in this process one after the other."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    from transformers import AutoConfig, AutoTokenizer

    from worker.engine.models.loader import resolve_checkpoint_dir

    path = resolve_checkpoint_dir(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    vocab = AutoConfig.from_pretrained(path).vocab_size
    eos = [tokenizer.eos_token_id]
    print(f"machine: {cpu_description()}; model {args.model}, vocabulary {vocab}")
    for cls in (Xgrammar, Llguidance):
        t0 = time.perf_counter()
        try:
            lib = cls(tokenizer, vocab, eos)
        except ImportError as exc:
            print(f"\n{cls.name}: not installed ({exc}); see this script's docstring")
            continue
        index_s = time.perf_counter() - t0
        print(f"\n{cls.name}: tokenizer index built in {index_s * 1e3:.0f} ms")
        print("| constraint | compile ms | mask per token us | tokens | takes valid | refuses invalid |")
        print("|---|---:|---:|---:|---|---|")
        for r in measure(lib, tokenizer, args.repeat):
            print(f"| {r['case']} | {r['compile_ms']:.2f} | {r['mask_us']:.1f} | {r['tokens']} | "
                  f"{'yes' if r['takes_valid'] else 'NO'} | {'yes' if r['refuses_invalid'] else 'NO'} |")


if __name__ == "__main__":
    main()
