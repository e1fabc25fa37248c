"""Entry point for ``celery -A api.control.celery_main worker -B``: the app from the
environment's settings. Creating it connects to nothing; the Context is made on first use."""

from __future__ import annotations

import functools

from api.context import Context, make_context
from api.control.celery_app import make_celery
from api.settings import Settings

settings = Settings.from_env()


@functools.cache
def get_ctx() -> Context:
    """The process's Context, created on first use."""
    return make_context(settings)


app = make_celery(settings, get_ctx)
