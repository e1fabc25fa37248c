"""``python -m worker.engine.grammar_probe``: tells whether the grammar library builds
each normalized structured-output constraint, one JSON line in, one JSON line out.

The API runs it as a helper process (``api/grammar_check.py``) so that a constraint the
library cannot compile is refused at submission with its reason, while the API process
itself never imports torch or xgrammar. Answers are ``{"error": null}`` or
``{"error": "...", "param": "response_format" | "guided_regex" | "guided_choice"}``.
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from worker.engine.structured import grammar_of
from worker.protocol.request_error import InvalidRequestError


def answer(spec: Any) -> dict[str, Any]:
    """The probe's answer for one constraint."""
    if not isinstance(spec, dict):
        return {"error": "a constraint must be a JSON object", "param": "response_format"}
    try:
        grammar_of(spec)
    except InvalidRequestError as exc:
        return {"error": str(exc), "param": exc.param}
    return {"error": None}


def serve(lines: TextIO, out: TextIO) -> None:
    """Answer every line of ``lines`` on ``out`` until end of input."""
    for line in lines:
        try:
            reply = answer(json.loads(line))
        except json.JSONDecodeError:
            reply = {"error": "not a JSON line", "param": "response_format"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    serve(sys.stdin, sys.stdout)
