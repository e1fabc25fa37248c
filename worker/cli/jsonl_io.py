"""JSONL files of ``inflight generate``: input lines, and an output file that can resume."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO


def read_input_lines(path: str) -> list[tuple[int, bytes]]:
    """``(line_number, raw_line)`` for every non-blank line (numbers count from 1).

    ``-`` reads standard input.
    """
    if path == "-":
        import sys

        data = sys.stdin.buffer.read()
    else:
        data = Path(path).read_bytes()
    return [(i, line) for i, line in enumerate(data.splitlines(), start=1) if line.strip()]


def prepare_output(path: str, *, resume: bool) -> set[str]:
    """Get ``path`` ready for appending; returns the custom_ids already written there.

    Without ``resume`` the file is emptied. With it, a torn last line (a run killed in the
    middle of a write) is cut off, so the appended lines stay one JSON object per line.
    """
    out = Path(path)
    if not resume or not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(b"")
        return set()
    data = out.read_bytes()
    if data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
        with out.open("r+b") as f:
            f.truncate(keep)
        data = data[:keep]
    done: set[str] = set()
    for raw in data.splitlines():
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("custom_id"), str):
            done.add(obj["custom_id"])
    return done


class OutputWriter:
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

    def __enter__(self) -> OutputWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
