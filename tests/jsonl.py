"""JSON Lines as the service writes them: one object per line, lines ended by ``\\n`` only.

``str.splitlines`` also breaks at U+0085, U+2028 and U+2029, which ``json.dumps(...,
ensure_ascii=False)`` leaves unescaped inside strings (a sampled completion may hold
them), so a reader built on it splits a line in two."""

from __future__ import annotations

import json
from typing import Any


def read_jsonl(text: str | bytes) -> list[Any]:
    """The objects of ``text``, one per non-blank ``\\n``-separated line."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    return [json.loads(line) for line in text.split("\n") if line.strip()]
