"""``python -m worker.engine.grammar_probe [--tokenizer-info FILE]``: the helper process of
``worker.engine.grammar_service``. It prints ``{"ready": true}`` once its imports are done,
then answers each normalized structured-output constraint, one JSON line in, one JSON line
out: ``{"error": null}`` or ``{"error": "...", "param": "response_format" | "guided_regex" |
"guided_choice"}``.

Without ``--tokenizer-info`` it builds the constraint's grammar (what the API checks: the
API knows no tokenizer); with it (a file of ``xgrammar.TokenizerInfo.serialize_json``,
written by the worker from its engine's tokenizer) it also compiles the grammar against
that vocabulary, as the engine will. The service bounds each answer in time and kills
this process when one takes too long; the API process itself never imports torch or
xgrammar.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

from worker.engine.structured import grammar_of, refused
from worker.protocol.request_error import InvalidRequestError


def answer(spec: Any, compile_grammar: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """The probe's answer for one constraint (``compile_grammar``: the tokenizer-bound
    compile, or None to build the grammar only)."""
    if not isinstance(spec, dict):
        return {"error": "a constraint must be a JSON object", "param": "response_format"}
    try:
        grammar = grammar_of(spec)
        if compile_grammar is not None:
            try:
                compile_grammar(grammar)
            except (RuntimeError, ValueError) as exc:
                raise refused(spec, exc) from None
    except InvalidRequestError as exc:
        return {"error": str(exc), "param": exc.param}
    return {"error": None}


def serve(lines: TextIO, out: TextIO, compile_grammar: Callable[[Any], Any] | None = None) -> None:
    """Say ready, then answer every line of ``lines`` on ``out`` until end of input."""
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in lines:
        try:
            reply = answer(json.loads(line), compile_grammar)
        except json.JSONDecodeError:
            reply = {"error": "not a JSON line", "param": "response_format"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


def _compiler(tokenizer_info_path: str) -> Callable[[Any], Any]:
    import xgrammar as xgr

    with open(tokenizer_info_path, encoding="utf-8") as f:
        info = xgr.TokenizerInfo.deserialize_json(f.read())
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    return compiler.compile_grammar


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m worker.engine.grammar_probe")
    parser.add_argument("--tokenizer-info", help="compile against this vocabulary too")
    args = parser.parse_args(argv)
    compile_grammar = _compiler(args.tokenizer_info) if args.tokenizer_info else None
    answer({"type": "regex", "pattern": "a"}, compile_grammar)  # loads the library: before
    serve(sys.stdin, sys.stdout, compile_grammar)  # "ready", so the bound counts compiles only


if __name__ == "__main__":
    main()
