"""Error lines found while expanding a batch, kept in a staging file until finalization."""

from __future__ import annotations

import json
from pathlib import Path

from api.context import Context


def staging_path(ctx: Context, batch_id: str) -> Path:
    """Where a batch's invalid-line errors wait for the finalizer."""
    path = ctx.storage.root / "staging" / f"{batch_id}.errors.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def append_errors(ctx: Context, batch_id: str, items: list[tuple[int, str]]) -> None:
    """Append (line number, output line) pairs."""
    if not items:
        return
    with open(staging_path(ctx, batch_id), "a", encoding="utf-8") as f:
        for line, text in items:
            f.write(json.dumps({"line": line, "text": text}) + "\n")
        f.flush()


def read_errors(ctx: Context, batch_id: str) -> dict[int, str]:
    """Line number -> error output line (later duplicates of a line, from a resumed
    expansion, replace earlier ones)."""
    path = staging_path(ctx, batch_id)
    out: dict[int, str] = {}
    if path.exists():
        with open(path, encoding="utf-8") as f:
            for raw in f:
                if raw.strip():
                    item = json.loads(raw)
                    out[int(item["line"])] = item["text"]
    return out
