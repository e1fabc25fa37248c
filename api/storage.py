"""File storage on a local (or mounted shared) directory."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger(__name__)


class FileTooLarge(Exception):
    """An upload went past the size limit."""


class Storage:
    """Files live at ``root/<tenant-hash>/<file_id>``; writes go to a temp name then rename."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path_for(self, *, tenant: str, file_id: str) -> Path:
        """Where a file's bytes live."""
        import hashlib

        bucket = hashlib.sha256(tenant.encode()).hexdigest()[:16]
        return self.root / bucket / file_id

    def save_stream(
        self, *, tenant: str, file_id: str, src: BinaryIO, limit: int, chunk: int = 1 << 20
    ) -> tuple[Path, int]:
        """Copy ``src`` to storage in chunks; returns (path, size). Raises FileTooLarge."""
        path = self.path_for(tenant=tenant, file_id=file_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".part")
        size = 0
        try:
            with open(tmp, "wb") as out:
                while True:
                    data = src.read(chunk)
                    if not data:
                        break
                    size += len(data)
                    if size > limit:
                        raise FileTooLarge(f"file is larger than {limit} bytes")
                    out.write(data)
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
        return path, size

    def writer(self, *, tenant: str, file_id: str) -> tuple[Path, Path]:
        """(temporary path, final path) for a generated file; rename when done."""
        path = self.path_for(tenant=tenant, file_id=file_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.with_suffix(".part"), path

    @staticmethod
    def remove(path: str | Path) -> bool:
        """Delete a stored file's bytes; whether they were there. An error other than a
        missing file is logged, not raised (the row is gone already: the bytes are an
        orphan an operator can remove)."""
        try:
            Path(path).unlink()
        except FileNotFoundError:
            return False
        except OSError:
            log.exception("could not remove %s", path)
            return False
        return True

    @staticmethod
    def iter_bytes(path: str | Path, chunk: int = 1 << 16) -> Iterator[bytes]:
        """Read a stored file in chunks."""
        with open(path, "rb") as f:
            while True:
                data = f.read(chunk)
                if not data:
                    return
                yield data
