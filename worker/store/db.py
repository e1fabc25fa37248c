"""Engine and session factories built from a database URL (SQLite file or PostgreSQL)."""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

DEFAULT_DATABASE_URL = "sqlite:///inflight.db"


def database_url(flag: str | None = None) -> str:
    """The URL to use: the flag if given, else ``DATABASE_URL``, else ``sqlite:///inflight.db``
    (a file in the working directory)."""
    return flag or os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL


def normalize_url(url: str) -> str:
    """Pick the psycopg 3 driver for plain ``postgres://`` / ``postgresql://`` URLs."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def make_engine(*, url: str, pool_size: int = 5, echo: bool = False) -> Engine:
    """Create an Engine. SQLite gets WAL and a busy timeout so a worker's threads and other
    processes can share the file; PostgreSQL gets pre-ping so a restarted server is survived."""
    url = normalize_url(url)
    # hide_parameters: a failed statement's error (and its log line) never carries the
    # bound values, which hold prompts and generated text.
    kwargs: dict[str, Any] = {"echo": echo, "pool_pre_ping": True, "hide_parameters": True}
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"timeout": 30, "check_same_thread": False}
        engine = create_engine(url, **kwargs)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            if ":memory:" not in url:
                cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    kwargs.update(pool_size=pool_size, max_overflow=pool_size, pool_recycle=1800)
    if url.startswith("postgresql"):
        kwargs["connect_args"] = {"connect_timeout": 5}
    return create_engine(url, **kwargs)


def make_session_factory(*, engine: Engine) -> sessionmaker[Session]:
    """A session factory whose objects stay readable after commit."""
    return sessionmaker(bind=engine, expire_on_commit=False)
