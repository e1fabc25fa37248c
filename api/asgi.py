"""``uvicorn --factory api.asgi:create_from_env``: the app from environment settings."""

from __future__ import annotations

from fastapi import FastAPI

from api.app import create_app
from api.settings import Settings


def create_from_env() -> FastAPI:
    """The app configured by the environment."""
    return create_app(Settings.from_env())
