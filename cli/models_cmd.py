"""``inflight models``: the models the live workers serve, read from the store as
``GET /v1/models`` reads them (a table, or the same JSON with ``--json``, plus the worker ids, which
the API shows tenants only as a count)."""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timedelta
from typing import Any

COLUMNS = ("MODEL", "ARCHITECTURE", "TYPE", "DTYPE", "CONTEXT", "SEEN", "WORKERS")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``models``."""
    p = subparsers.add_parser(
        "models",
        help="the models the live workers serve",
        description="Each model served by a worker seen within --worker-timeout (as GET "
        "/v1/models lists them): architecture, model type, dtype, context length (the "
        "smallest among its workers), seconds since one of them was seen, the worker ids.",
    )
    p.add_argument("--json", action="store_true", help="the GET /v1/models body, as JSON, with the worker ids")
    p.add_argument("--worker-timeout", type=float, default=30.0,
                   help="a worker silent this long is not live (30 s)")  # fmt: skip
    p.add_argument("--database-url", default=None, help="overrides DATABASE_URL")
    p.set_defaults(func=run)


def format_models(models: list[Any], *, now: datetime) -> list[str]:
    """The table: a header, then one line per model."""
    rows = [
        (
            m.id,
            m.architecture or "-",
            m.model_type or "-",
            m.dtype or "-",
            "-" if m.max_model_len is None else str(m.max_model_len),
            f"{max((now - m.last_seen).total_seconds(), 0.0):.1f}s",
            ",".join(m.workers),
        )
        for m in models
    ]
    widths = [max(len(r[i]) for r in [COLUMNS, *rows]) for i in range(len(COLUMNS) - 1)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1]
        for r in [COLUMNS, *rows]
    ]
    if not rows:
        lines.append("  (no model: no worker seen within the worker timeout)")
    return lines


def run(args: argparse.Namespace) -> int:
    """Print the served models."""
    from api.views import model_list_view
    from worker.store.base import utcnow
    from worker.store.crud.served_models import served_models
    from worker.store.db import database_url, make_engine, make_session_factory

    db = make_engine(url=database_url(args.database_url))
    try:
        now = utcnow()
        with make_session_factory(engine=db)() as session:
            models = served_models(
                session=session, within=timedelta(seconds=args.worker_timeout), now=now
            )
    finally:
        db.dispose()
    if args.json:
        print(json.dumps(model_list_view(models, worker_ids=True), indent=2))
    else:
        print("\n".join(format_models(models, now=now)))
    return 0
