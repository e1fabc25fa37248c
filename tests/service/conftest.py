"""Fixtures for the service tests: throwaway PostgreSQL databases, an isolated Redis key
prefix, migrated SQLite files. Tests needing a service that is not answering are skipped."""

from __future__ import annotations

import contextlib
import socket
import uuid
from collections.abc import Iterator

import pytest

PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
PG_BASE = "postgresql://postgres@127.0.0.1:5432/"
REDIS_DB = 13  # a database number of its own; keys also carry a unique prefix per test
REDIS_URL = f"redis://127.0.0.1:6379/{REDIS_DB}"


def _port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


@pytest.fixture(scope="session")
def pg_available() -> None:
    """Skip when PostgreSQL is not answering on 127.0.0.1:5432."""
    if not _port_open(5432):
        pytest.skip("PostgreSQL is not answering on 127.0.0.1:5432 (start it to run this test)")


@pytest.fixture(scope="session")
def redis_available() -> None:
    """Skip when Redis is not answering on 127.0.0.1:6379."""
    if not _port_open(6379):
        pytest.skip("Redis is not answering on 127.0.0.1:6379 (start it to run this test)")


@pytest.fixture
def pg_url(pg_available: None) -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database, dropped afterwards."""
    import psycopg

    name = f"inflight_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield PG_BASE + name
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    """URL of a fresh SQLite file."""
    return f"sqlite:///{tmp_path / 'inflight.db'}"


@pytest.fixture
def migrated_pg(pg_url: str) -> str:
    """A fresh PostgreSQL database at the latest revision."""
    from migrations.run import upgrade

    upgrade(url=pg_url)
    return pg_url


@pytest.fixture
def migrated_sqlite(sqlite_url: str) -> str:
    """A fresh SQLite database at the latest revision."""
    from migrations.run import upgrade

    upgrade(url=sqlite_url)
    return sqlite_url


@pytest.fixture
def session_factory(migrated_pg: str):
    """Session factory on a migrated PostgreSQL database."""
    from worker.store.db import make_engine, make_session_factory

    engine = make_engine(url=migrated_pg)
    yield make_session_factory(engine=engine)
    engine.dispose()


@pytest.fixture
def redis_client(redis_available: None):
    """A client on the test Redis database."""
    from worker.queue.connection import make_redis

    client = make_redis(url=REDIS_URL)
    yield client
    client.close()


@pytest.fixture(params=["single", "cluster"])
def any_redis(request):
    """The URL of the test Redis (one server) and, as a second run, of the local cluster."""
    if request.param == "single":
        request.getfixturevalue("redis_available")
        return REDIS_URL
    return request.getfixturevalue("redis_cluster").url


@pytest.fixture
def any_redis_client(any_redis: str):
    """A client on the test Redis, then (a second run) on the local cluster."""
    from worker.queue.connection import make_redis

    client = make_redis(url=any_redis)
    yield client
    client.close()


TEST_MODEL = "tiny-llama"  # the model of the workers these tests start


@pytest.fixture
def keys(redis_client) -> Iterator[object]:
    """Queue keys of ``TEST_MODEL`` under a unique prefix; every key under it is deleted
    afterwards."""
    from worker.queue.keys import QueueKeys

    k = QueueKeys(prefix=f"inflight-test-{uuid.uuid4().hex[:10]}", model=TEST_MODEL)
    yield k
    delete_prefix(redis_client, k.prefix)


def delete_prefix(client, prefix: str) -> int:
    """Delete every key under ``prefix``, of every model (what a FLUSHDB does to this
    test's keys)."""
    from worker.queue.keys import QueueKeys
    from worker.queue.wipe import delete_deployment

    return delete_deployment(redis_client=client, keys=QueueKeys(prefix=prefix))
