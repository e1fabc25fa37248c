"""``inflight api``: serve the REST API with uvicorn."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``api``."""
    p = subparsers.add_parser(
        "api",
        help="serve the REST API",
        description="Serve the REST API (jobs, batches, files, workers, health, metrics). "
        "Control-plane tasks run in-process unless INFLIGHT_CELERY_EAGER=0, in which case run "
        "`celery -A api.control.celery_main worker -B` next to it.",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--database-url", default=None, help="overrides DATABASE_URL")
    p.add_argument("--redis-url", default=None, help="overrides REDIS_URL")
    p.add_argument("--prefix", default=None, help="Redis key prefix (INFLIGHT_PREFIX)")
    p.add_argument("--storage-dir", default=None, help="file storage (INFLIGHT_STORAGE_DIR)")
    p.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    p.add_argument("--migrate", action="store_true", help="apply migrations before serving")
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted."""
    import os

    import uvicorn

    from api.app import create_app
    from api.settings import Settings

    settings = Settings.from_env(
        database_url=args.database_url,
        redis_url=args.redis_url,
        prefix=args.prefix,
        storage_dir=args.storage_dir,
    )
    if args.migrate:
        from migrations.run import upgrade

        upgrade(url=settings.database_url)
    if args.workers > 1:
        for name, value in (
            ("DATABASE_URL", settings.database_url),
            ("REDIS_URL", settings.redis_url),
            ("INFLIGHT_PREFIX", settings.prefix),
            ("INFLIGHT_STORAGE_DIR", settings.storage_dir),
        ):
            os.environ[name] = value
        uvicorn.run(
            "api.asgi:create_from_env",
            factory=True,
            host=args.host,
            port=args.port,
            workers=args.workers,
            log_level=args.log_level,
        )
    else:
        from worker.telemetry.setup import configure_telemetry

        configure_telemetry("inflight-api")
        uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level=args.log_level)
    return 0
