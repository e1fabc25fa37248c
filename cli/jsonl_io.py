"""JSONL files of ``inflight generate``: input lines, and an output file that can resume."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO


def iter_input_lines(path: str) -> Iterator[tuple[int, bytes]]:
    """``(line_number, raw_line)`` for every non-blank line (numbers count from 1), read
    one line at a time so memory does not grow with the file. ``-`` reads standard input.
    """
    stream: IO[bytes] = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115
    try:
        for number, line in enumerate(stream, start=1):
            line = line.rstrip(b"\r\n")
            if line.strip():
                yield number, line
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


def count_input_lines(path: str) -> int | None:
    """How many non-blank lines the file holds (one streaming pass); None for stdin."""
    if path == "-":
        return None
    return sum(1 for _ in iter_input_lines(path))


def prepare_output(path: str, *, resume: bool) -> set[str]:
    """Get ``path`` ready for appending; returns the custom_ids already written there.

    Without ``resume`` the file is emptied. With it, a torn last line (a run killed in the
    middle of a write) is cut off, so the appended lines stay one JSON object per line. The
    file is read line by line: only the ids are kept.
    """
    out = Path(path)
    if not resume or not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(b"")
        return set()
    done: set[str] = set()
    with out.open("r+b") as f:
        keep = 0
        for raw in f:
            if not raw.endswith(b"\n"):
                break  # the torn last line: cut below
            keep += len(raw)
            custom_id = _custom_id(raw)
            if custom_id is not None:
                done.add(custom_id)
        f.truncate(keep)
    return done


def _custom_id(raw: bytes) -> str | None:
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    if isinstance(obj, dict) and isinstance(obj.get("custom_id"), str):
        return str(obj["custom_id"])
    return None


class ResultsFile:
    """Appends output lines and flushes each one, so a killed run loses nothing written."""

    def __init__(self, path: str) -> None:
        self._file: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115
        self.lines_written = 0

    def write(self, line: str) -> None:
        """Write one line (without its newline) and flush it to the OS."""
        self._file.write(line + "\n")
        self._file.flush()
        self.lines_written += 1

    def close(self) -> None:
        """Flush to disk and close."""
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()

    def __enter__(self) -> ResultsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
