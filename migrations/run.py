"""Run the store's Alembic migrations from code (what ``inflight migrate`` calls).

The scripts are this package's own directory (env.py, script.py.mako, versions/), so the
configuration is built here rather than read from the repository's alembic.ini: it works
from any directory and in an installed package."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from worker.store.db import normalize_url

MIGRATIONS_DIR = Path(__file__).resolve().parent  # the migrations package: env.py, versions/


def alembic_config(*, url: str) -> Config:
    """An Alembic Config pointing at the packaged scripts and the given database."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("path_separator", "os")
    cfg.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return cfg


def upgrade(*, url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` up to ``revision`` (default: the latest)."""
    command.upgrade(alembic_config(url=url), revision)


def downgrade(*, url: str, revision: str) -> None:
    """Migrate the database at ``url`` down to ``revision`` (``base`` empties it)."""
    command.downgrade(alembic_config(url=url), revision)


def current(*, url: str) -> None:
    """Print the revision the database is at."""
    command.current(alembic_config(url=url))
