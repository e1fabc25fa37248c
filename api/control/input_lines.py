"""Reading a batch input file line by line with bounded memory: a count of its lines
(before anything is expanded), the model its first request names, and the lines
themselves, each cut at a byte limit.

Lines are numbered as the expansion numbers them: every ``\\n`` ends one, a last line
without one counts too, and blank lines count (they are skipped, not renumbered)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, BinaryIO

_BLOCK = 1 << 20


def count_lines(path: str, *, stop_after: int | None = None) -> int:
    """How many lines of the file a batch's line limit sees: the number of its last
    non-blank line (blank lines before a request count, trailing ones do not). Counts
    ``\n`` in 1 MiB blocks, keeping nothing, which is the answer or an upper bound of it;
    only a file whose raw count passes ``stop_after`` is read again line by line, so the
    answer is exact whenever it is above ``stop_after``."""
    n = 0
    last = b"\n"
    with open(path, "rb") as src:
        while block := src.read(_BLOCK):
            n += block.count(b"\n")
            last = block[-1:]
    total = n if last == b"\n" else n + 1
    if stop_after is None or total <= stop_after:
        return total
    last_request = 0
    with open(path, "rb") as src:
        for line_no, (raw, _) in enumerate(capped_lines(src, max_bytes=_BLOCK), start=1):
            if raw is None or raw.strip():
                last_request = line_no
    return last_request


def first_line_model(path: str, *, max_bytes: int, scan_lines: int = 1000) -> str | None:
    """The ``model`` the file's first request names: of the first line (within the first
    ``scan_lines``) that is a JSON object, ``body.model`` in the OpenAI Batch shape, else
    its own ``model``; None where that line names none (or no line is an object)."""
    with open(path, "rb") as src:
        for n, (raw, _) in enumerate(capped_lines(src, max_bytes=max_bytes)):
            if n >= scan_lines:
                return None
            if raw is None or not raw.strip():
                continue
            try:
                obj: Any = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(obj, dict):
                continue
            body = obj.get("body")
            model = (body if isinstance(body, dict) else obj).get("model")
            return model if isinstance(model, str) else None
    return None


def capped_lines(src: BinaryIO, *, max_bytes: int) -> Iterator[tuple[bytes | None, int]]:
    """Each line of ``src`` (with its newline) and its size in bytes; a line longer than
    ``max_bytes`` is yielded as None and never held in memory whole (it is read through
    in blocks of at most ``max_bytes``)."""
    while True:
        line = src.readline(max_bytes + 1)
        if not line:
            return
        if len(line) <= max_bytes or (line.endswith(b"\n") and len(line) == max_bytes + 1):
            yield line, len(line)
            continue
        size = len(line)
        while not line.endswith(b"\n"):
            line = src.readline(max_bytes + 1)
            if not line:
                break
            size += len(line)
        yield None, size


def unread_lines(path: str, *, after: int, max_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    """The request lines of the file after line ``after`` (what an expansion stopped
    before reading): (line number, the line, or None when it is over ``max_bytes``), blank
    lines skipped as the expansion skips them."""
    with open(path, "rb") as src:
        for line_no, (raw, _) in enumerate(capped_lines(src, max_bytes=max_bytes), start=1):
            if line_no > after and (raw is None or raw.strip()):
                yield line_no, raw
