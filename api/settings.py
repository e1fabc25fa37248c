"""API settings, read from the environment (``INFLIGHT_*``, ``DATABASE_URL``, ``REDIS_URL``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from worker.queue.connection import redis_url
from worker.store.db import database_url


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else default


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value in (None, ""):
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


@dataclass
class Settings:
    """Everything that shapes one API process (sizes in bytes, times in seconds)."""

    database_url: str = field(default_factory=lambda: database_url())
    redis_url: str = field(default_factory=lambda: redis_url())
    prefix: str = "inflight"  # Redis key prefix, shared with the workers
    storage_dir: str = "inflight-files"  # uploaded and generated files
    model_name: str = "inflight"  # ``model`` in response bodies when the request names none
    max_body_bytes: int = 1 << 20  # JSON request bodies
    max_file_bytes: int = 200 << 20  # uploads (OpenAI's limit)
    max_prompt_tokens: int = 32_768  # estimated; token-id prompts are counted exactly
    max_tokens_limit: int = 8_192  # upper bound of max_tokens
    max_batch_lines: int = 50_000  # OpenAI's limit per batch
    db_pool_size: int = 10
    celery_eager: bool = True  # run control-plane tasks in-process (the embedded default)
    broker_url: str | None = None  # default: redis_url
    beat_interval: float = 5.0  # embedded mode: how often the in-process beat ticks (0: off)
    expand_chunk: int = 500  # batch lines per transaction + XADD pipeline
    max_queue_depth: int = 1_000_000  # entries per stream before 429 (0: no bound)
    expand_lease: float = 60.0  # an expansion not renewed (per chunk) this long is dead
    webhook_max_attempts: int = 6
    webhook_backoff: float = 2.0  # first retry after this long, doubling
    webhook_timeout: float = 5.0
    iteration_retention_days: float = 7.0
    reconcile_grace: float = 30.0
    worker_timeout: float = 30.0
    auth_cache_ttl: float = 30.0

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Settings from the environment; keyword arguments win."""
        s = cls(
            prefix=os.environ.get("INFLIGHT_PREFIX", "inflight"),
            storage_dir=os.environ.get("INFLIGHT_STORAGE_DIR", "inflight-files"),
            model_name=os.environ.get("INFLIGHT_MODEL_NAME", "inflight"),
            max_body_bytes=_env_int("INFLIGHT_MAX_BODY_BYTES", 1 << 20),
            max_file_bytes=_env_int("INFLIGHT_MAX_FILE_BYTES", 200 << 20),
            max_prompt_tokens=_env_int("INFLIGHT_MAX_PROMPT_TOKENS", 32_768),
            max_tokens_limit=_env_int("INFLIGHT_MAX_TOKENS_LIMIT", 8_192),
            max_batch_lines=_env_int("INFLIGHT_MAX_BATCH_LINES", 50_000),
            db_pool_size=_env_int("INFLIGHT_DB_POOL_SIZE", 10),
            celery_eager=_env_bool("INFLIGHT_CELERY_EAGER", True),
            broker_url=os.environ.get("CELERY_BROKER_URL") or None,
            beat_interval=_env_float("INFLIGHT_BEAT_INTERVAL", 5.0),
            expand_chunk=_env_int("INFLIGHT_EXPAND_CHUNK", 500),
            expand_lease=_env_float("INFLIGHT_EXPAND_LEASE", 60.0),
            max_queue_depth=_env_int("INFLIGHT_MAX_QUEUE_DEPTH", 1_000_000),
            webhook_max_attempts=_env_int("INFLIGHT_WEBHOOK_MAX_ATTEMPTS", 6),
            webhook_backoff=_env_float("INFLIGHT_WEBHOOK_BACKOFF", 2.0),
            iteration_retention_days=_env_float("INFLIGHT_ITERATION_RETENTION_DAYS", 7.0),
        )
        for name, value in overrides.items():
            if value is not None:
                setattr(s, name, value)
        return s

    @property
    def storage_path(self) -> Path:
        """The storage directory as a Path."""
        return Path(self.storage_dir)
