"""The FastAPI application factory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from api.auth import KeyCache
from api.context import Context, make_context
from api.errors import install_error_handlers
from api.job_waiter import close_async_redis
from api.limits import BodySizeLimit
from api.metrics import HttpMetrics, MetricsMiddleware
from api.settings import Settings
from api.tracing import TracingMiddleware


def create_app(settings: Settings | None = None, *, ctx: Context | None = None) -> FastAPI:
    """Build the API app. Pools are created here but connect on first use; in eager mode
    the in-process beat starts with the app's lifespan and stops with it."""
    from api.control.celery_app import Dispatcher, EmbeddedBeat, beat_schedule, make_celery
    from api.routers import (
        batches,
        completions,
        files,
        health,
        jobs,
        models,
        usage,
        webhook_secret,
        workers,
    )

    settings = settings or (ctx.settings if ctx else Settings.from_env())
    context = ctx or make_context(settings)
    celery = make_celery(settings, lambda: context)
    beat = (EmbeddedBeat(celery, interval=settings.beat_interval,
                         schedule=beat_schedule(settings))
            if settings.celery_eager else None)
    dispatcher = Dispatcher(celery)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if beat is not None:
            beat.start()
        try:
            yield
        finally:
            if beat is not None:
                beat.stop()
            dispatcher.close()
            await close_async_redis()
            if ctx is None:
                context.close()

    app = FastAPI(
        title="inflight",
        version="0.1.0",
        description="Queue-fed LLM generation: jobs, OpenAI-style batches, workers.",
        lifespan=lifespan,
        docs_url="/docs" if settings.docs_enabled else None,
        redoc_url="/redoc" if settings.docs_enabled else None,
        openapi_url="/openapi.json" if settings.docs_enabled else None,
    )
    app.state.ctx = context
    app.state.settings = settings
    app.state.celery = celery
    app.state.beat = beat
    app.state.dispatcher = dispatcher
    app.state.key_cache = KeyCache(settings.auth_cache_ttl)
    app.state.http_metrics = HttpMetrics()
    install_error_handlers(app)
    app.add_middleware(MetricsMiddleware, metrics=app.state.http_metrics)
    app.add_middleware(
        BodySizeLimit, json_limit=settings.max_body_bytes, file_limit=settings.max_file_bytes
    )
    app.add_middleware(TracingMiddleware)  # outermost: the span covers the whole request
    for module in (health, jobs, completions, batches, files, models, workers, webhook_secret,
                   usage):
        app.include_router(module.router)
    return app
