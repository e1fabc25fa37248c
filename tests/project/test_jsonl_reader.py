"""tests/jsonl.py reads the service's JSON Lines as written: a string holding U+0085, U+2028
or U+2029 (left unescaped by ``ensure_ascii=False``) stays in its line."""

from __future__ import annotations

import json

from tests.jsonl import read_jsonl


def test_a_line_separator_inside_a_string_does_not_split_the_line() -> None:
    rows = [{"text": "a\u2028b"}, {"text": "c\x85d\u2029e"}, {"text": "plain"}]
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    assert len(text.splitlines()) > len(rows)  # what the readers did before
    assert read_jsonl(text) == rows
    assert read_jsonl(text.encode()) == rows
