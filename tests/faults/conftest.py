"""Fault tests: real processes (API, worker, Celery) killed or cut off mid-run against the
real Redis and PostgreSQL. They reuse the API tests' throwaway database and app factory."""

from __future__ import annotations

from tests.api.conftest import api_db_url, make_env  # noqa: F401  (fixtures)
