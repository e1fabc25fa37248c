"""Entry point for ``celery -A api.control.celery_main worker -B``: the app from the
environment's settings. Creating it connects to nothing; the Context is made on first use."""

from __future__ import annotations

import functools

from celery import signals

from api.context import Context, make_context
from api.control.celery_app import make_celery
from api.settings import Settings

settings = Settings.from_env()


@functools.cache
def get_ctx() -> Context:
    """The process's Context, created on first use."""
    return make_context(settings)


app = make_celery(settings, get_ctx)


@signals.worker_init.connect
@signals.beat_init.connect
def _telemetry(**_: object) -> None:
    """Telemetry from ``OTEL_*`` when a Celery worker or beat starts (not at import); the
    SDK's export threads restart in forked pool processes by themselves."""
    from worker.telemetry.setup import configure_telemetry

    configure_telemetry("inflight-control")
