"""Fault tests: real processes (API, worker, Celery) killed or cut off mid-run against the
real Redis and PostgreSQL. They reuse the API and service tests' throwaway databases, key
prefixes and app factory."""

from __future__ import annotations

from tests.api.conftest import api_db_url, make_env  # noqa: F401  (fixtures)
from tests.service.conftest import (  # noqa: F401  (fixtures)
    keys,
    migrated_pg,
    pg_available,
    pg_url,
    redis_available,
    redis_client,
    session_factory,
)
