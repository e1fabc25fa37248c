"""Alembic environment: runs migrations against ``sqlalchemy.url`` or ``DATABASE_URL``."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

import worker.store.models  # noqa: F401  (registers every table)
from worker.store.base import Base
from worker.store.db import database_url, make_engine

target_metadata = Base.metadata
config = context.config


def _url() -> str:
    return config.get_main_option("sqlalchemy.url") or database_url()


def _configure(connection: Connection | None = None, **kw: object) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        render_as_batch=True,  # SQLite needs batch mode for ALTER
        **kw,  # type: ignore[arg-type]
    )


def run_offline() -> None:
    """Emit SQL to stdout instead of running it."""
    _configure(url=_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    """Run against a live connection (one passed in by the caller, or a new engine)."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(url=_url())
    try:
        with engine.connect() as conn:
            _configure(conn)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
