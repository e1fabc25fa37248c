"""Row leases: who may work on a row, and until when.

A lease is a holder id (unique per claimer: host, pid and a random part) and an expiry,
stored in two columns of the leased row. The claimer takes rows whose lease expired (under
``FOR UPDATE SKIP LOCKED``, so overlapping claimers never take the same row), renews the
rows it still works on before their lease runs out, and writes its result only where it
still holds the lease: a claimer that outlived its lease (a slow receiver, a stalled
process) finds its write refused instead of overwriting the one that took the row over."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, update
from sqlalchemy.orm import InstrumentedAttribute, Session

from worker.store.base import utcnow


def new_holder() -> str:
    """A holder id no other claimer uses: ``host:pid:random`` (at most 64 characters)."""
    return f"{socket.gethostname()[:32]}:{os.getpid()}:{uuid.uuid4().hex[:16]}"


@dataclass(frozen=True)
class LeaseColumns:
    """Where a table keeps its lease: the row key, the holder and the expiry column."""

    key: InstrumentedAttribute[Any]
    holder: InstrumentedAttribute[Any]
    until: InstrumentedAttribute[Any]


@dataclass(frozen=True)
class Lease:
    """One claimer's lease on rows of one table: its holder id and how long a claim or a
    renewal lasts."""

    columns: LeaseColumns
    ttl: timedelta
    holder: str = field(default_factory=new_holder)

    def expiry(self, now: datetime | None = None) -> datetime:
        """When a claim or renewal made now runs out."""
        return (now or utcnow()) + self.ttl

    def held(self) -> ColumnElement[bool]:
        """The condition "this lease holds the row", for the ``WHERE`` of every write."""
        return self.columns.holder == self.holder

    def claim(self, session: Session, keys: Sequence[Any], **values: Any) -> None:
        """Take rows the caller selected and locked (their lease expired): set holder and
        expiry, and any other ``values``."""
        if keys:
            cols = self.columns
            session.execute(
                update(cols.key.class_)
                .where(cols.key.in_(list(keys)))
                .values({cols.holder: self.holder, cols.until: self.expiry(), **values})
            )

    def renew(self, session: Session, keys: Sequence[Any]) -> set[Any]:
        """Push the expiry of the rows among ``keys`` this lease still holds; returns
        those (a row another claimer took after it expired is not ours any more)."""
        if not keys:
            return set()
        cols = self.columns
        result = session.execute(
            update(cols.key.class_)
            .where(cols.key.in_(list(keys)), self.held())
            .values({cols.until: self.expiry()})
            .returning(cols.key)
        )
        return set(result.scalars())

    def write(self, session: Session, key: Any, **values: Any) -> bool:
        """Write ``values`` to the row only while this lease holds it, and release it
        (holder cleared). False when another claimer holds it now: nothing written."""
        cols = self.columns
        result = session.execute(
            update(cols.key.class_)
            .where(cols.key == key, self.held())
            .values({cols.holder: None, **values})
        )
        return bool(getattr(result, "rowcount", 0))
