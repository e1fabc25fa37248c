"""Fault tests: real processes (API, worker, Celery) killed or cut off mid-run against the
real Redis and PostgreSQL. They reuse the API and service tests' throwaway databases, key
prefixes and app factory."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.conftest import api_db_url, make_env  # noqa: F401  (fixtures)
from tests.faults.processes import PrivateRedis
from tests.service.conftest import (  # noqa: F401  (fixtures)
    keys,
    migrated_pg,
    pg_available,
    pg_url,
    redis_available,
    redis_client,
    session_factory,
)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A redis-server of this test's own (skipped when redis-server is not installed)."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = PrivateRedis(tmp_path)
    yield server
    server.stop()
