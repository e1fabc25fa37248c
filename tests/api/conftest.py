"""Fixtures for the API tests: one migrated throwaway PostgreSQL database per session, a
unique Redis key prefix and storage directory per test, an app and API keys per tenant.
Tests are skipped (with the reason) when PostgreSQL or Redis is not answering."""

from __future__ import annotations

import contextlib
import socket
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
PG_BASE = "postgresql://postgres@127.0.0.1:5432/"
REDIS_URL = "redis://127.0.0.1:6379/12"  # a database number of its own, plus unique prefixes
OPERATOR_KEY = "test-operator-key"


def _port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


@pytest.fixture(scope="session")
def api_db_url() -> Iterator[str]:
    """A fresh PostgreSQL database at the latest revision, dropped after the session."""
    if not _port_open(5432):
        pytest.skip("PostgreSQL is not answering on 127.0.0.1:5432 (start it to run the API tests)")
    if not _port_open(6379):
        pytest.skip("Redis is not answering on 127.0.0.1:6379 (start it to run the API tests)")
    import psycopg

    from migrations.run import upgrade

    name = f"inflight_api_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = PG_BASE + name
    upgrade(url=url)
    yield url
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class ApiEnv:
    """One test's app, its resources and a way to get API keys."""

    client: Any  # fastapi.testclient.TestClient
    ctx: Any  # api.context.Context
    app: Any
    settings: Any

    def key(self, tenant: str) -> str:
        """A fresh API key for ``tenant``."""
        from worker.store.crud.api_keys import create_api_key

        with self.ctx.session_factory.begin() as session:
            _, plain = create_api_key(session=session, tenant=tenant)
        return plain

    def auth(self, tenant: str) -> dict[str, str]:
        """Headers authenticating as ``tenant``."""
        return {"Authorization": f"Bearer {self.key(tenant)}"}


@pytest.fixture
def make_env(api_db_url: str, tmp_path: Path) -> Iterator[Callable[..., ApiEnv]]:
    """Factory: an ApiEnv with settings overrides; everything is torn down afterwards."""
    from fastapi.testclient import TestClient

    from api.app import create_app
    from api.context import make_context
    from api.settings import Settings

    made: list[tuple[Any, Any]] = []

    def factory(**overrides: Any) -> ApiEnv:
        prefix = f"inflight-apitest-{uuid.uuid4().hex[:10]}"
        values: dict[str, Any] = {
            "database_url": api_db_url,
            "redis_url": REDIS_URL,
            "prefix": prefix,
            "storage_dir": str(tmp_path / f"files-{len(made)}"),
            "beat_interval": 0,
            "operator_key": OPERATOR_KEY,
            "default_model": "tiny-llama",  # the model of tiny_worker
        }
        settings = Settings(**{**values, **overrides})
        ctx = make_context(settings)
        app = create_app(settings, ctx=ctx)
        client = TestClient(app)
        client.__enter__()
        made.append((client, ctx))
        return ApiEnv(client=client, ctx=ctx, app=app, settings=settings)

    yield factory
    for client, ctx in made:
        client.__exit__(None, None, None)
        with contextlib.suppress(Exception):
            from worker.queue.wipe import delete_deployment

            delete_deployment(redis_client=ctx.redis, keys=ctx.keys)
        ctx.close()


@pytest.fixture
def env(make_env: Callable[..., ApiEnv]) -> ApiEnv:
    """An ApiEnv with the default settings (eager control plane, no beat thread)."""
    return make_env()


def batch_lines(n: int, *, tag: str = "r", max_tokens: int = 4) -> list[dict[str, Any]]:
    """``n`` OpenAI Batch input lines for /v1/completions."""
    return [
        {
            "custom_id": f"{tag}-{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {
                "prompt": f"{tag} {i}: the quick brown fox",
                "max_tokens": max_tokens,
                "temperature": 0,
            },
        }
        for i in range(n)
    ]


def jsonl(lines: list[Any]) -> bytes:
    """Encode objects (or raw strings) as JSONL bytes."""
    import json

    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines).encode()


def wait_expanded(env: ApiEnv, headers: dict[str, str], batch_id: str, timeout: float = 30) -> Any:
    """Wait until the background tasks sent so far (the batch's expansion, and the
    finalization it may run) ended, then return ``GET /v1/batches/{id}``."""
    assert env.app.state.dispatcher.wait_idle(timeout), f"batch {batch_id} still expanding"
    r = env.client.get(f"/v1/batches/{batch_id}", headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


TINY_ENGINE: dict[str, Any] = {"model": "tiny-llama", "max_num_seqs": 32, "num_kv_blocks": 256,
                               "max_model_len": 512}


@contextlib.contextmanager
def tiny_worker(env: ApiEnv, name: str, *, redis_url: str = REDIS_URL,
                config: dict[str, Any] | None = None, **engine: Any) -> Iterator[Any]:
    """An in-process worker on the tiny model serving ``env``'s queues (on ``redis_url``),
    stopped on exit; ``engine`` overrides TINY_ENGINE's arguments, ``config`` the
    WorkerConfig's."""
    pytest.importorskip("torch")
    import threading

    from worker.service.config import WorkerConfig
    from worker.service.worker import WorkerProcess

    def engine_factory(_config: WorkerConfig) -> Any:
        from worker.engine import EngineArgs, LLMEngine

        return LLMEngine(EngineArgs(**{**TINY_ENGINE, **engine}))

    worker_config = WorkerConfig(
        database_url=env.settings.database_url, redis_url=redis_url, model="tiny-llama",
        prefix=env.ctx.keys.prefix, name=name, heartbeat_interval=0.3,
        cancel_poll_interval=0.05, reconcile_interval=3600, **(config or {}),
    )
    w = WorkerProcess(worker_config, engine_factory=engine_factory, install_signals=False)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        yield w
    finally:
        w.stop()
        t.join(60)
