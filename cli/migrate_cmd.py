"""``inflight migrate``: bring the store's schema up to date (SQLite file or PostgreSQL)."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``migrate``."""
    p = subparsers.add_parser(
        "migrate",
        help="run the database migrations",
        description="Upgrade (or downgrade) the SQL store. DATABASE_URL or --database-url picks the "
        "database; default: sqlite:///inflight.db in the working directory.",
    )
    p.add_argument("--database-url", default=None, help="overrides DATABASE_URL")
    p.add_argument("--revision", default="head", help="target revision (default: head)")
    p.add_argument("--downgrade", action="store_true", help="downgrade to --revision (e.g. base)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the migrations; 0 on success."""
    from migrations.run import downgrade, upgrade
    from worker.store.db import database_url

    url = database_url(args.database_url)
    if args.downgrade:
        downgrade(url=url, revision=args.revision)
    else:
        upgrade(url=url, revision=args.revision)
    print(f"database at {args.revision} ({_safe(url)})")
    return 0


def _safe(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
