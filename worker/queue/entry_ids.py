"""Stream entry ids (``<ms>-<seq>``) compared as what they are: pairs of numbers."""

from __future__ import annotations


def id_key(entry_id: str) -> tuple[int, int]:
    """Sort key of a stream entry id (``ms-seq``), compared as numbers."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
