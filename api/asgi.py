"""``uvicorn --factory api.asgi:create_from_env``: the app from environment settings."""

from __future__ import annotations

from fastapi import FastAPI

from api.app import create_app
from api.settings import Settings
from worker.telemetry.setup import configure_telemetry


def create_from_env() -> FastAPI:
    """The app configured by the environment (telemetry too: ``OTEL_*``); uvicorn calls
    this once in each worker process."""
    configure_telemetry("inflight-api")
    return create_app(Settings.from_env())
