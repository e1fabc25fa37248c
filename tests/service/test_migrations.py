"""Migrations: fresh SQLite and PostgreSQL databases reach head, match the models, go back."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from migrations.run import downgrade, upgrade
from worker.store.base import Base
from worker.store.db import make_engine

TABLES = {
    "jobs", "iterations", "batches", "workers", "api_keys", "files", "api_jobs", "batch_progress",
    "webhook_secrets", "alembic_version",
}


def _diff(url: str) -> list:
    import worker.store.models  # noqa: F401

    engine = make_engine(url=url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            return compare_metadata(ctx, Base.metadata)
    finally:
        engine.dispose()


@pytest.mark.services
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migrations_match_models(backend: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("sqlite_url" if backend == "sqlite" else "pg_url")
    upgrade(url=url)
    engine = make_engine(url=url)
    assert set(inspect(engine).get_table_names()) == TABLES
    engine.dispose()
    assert _diff(url) == []
    downgrade(url=url, revision="base")
    engine = make_engine(url=url)
    assert set(inspect(engine).get_table_names()) == {"alembic_version"}
    engine.dispose()
    upgrade(url=url)  # and up again
    assert _diff(url) == []


def _job_indexes(url: str) -> dict[str | None, list[str | None]]:
    engine = make_engine(url=url)
    try:
        return {ix["name"]: list(ix["column_names"]) for ix in inspect(engine).get_indexes("jobs")}
    finally:
        engine.dispose()


@pytest.mark.services
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_listing_indexes_replace_their_prefixes_and_come_back(
    backend: str, request: pytest.FixtureRequest
) -> None:
    """0007 adds the keyset listing's indexes and drops (tenant, status) and (batch_id),
    their prefixes; going back to 0006 restores exactly the old set."""
    url = request.getfixturevalue("sqlite_url" if backend == "sqlite" else "pg_url")
    upgrade(url=url, revision="0006")
    before = _job_indexes(url)
    assert before["ix_jobs_tenant_status"] == ["tenant", "status"]
    assert before["ix_jobs_batch_id"] == ["batch_id"]
    upgrade(url=url)
    after = _job_indexes(url)
    assert after["ix_jobs_queued_at_id"] == ["queued_at", "id"]
    assert after["ix_jobs_tenant_queued_at_id"] == ["tenant", "queued_at", "id"]
    assert after["ix_jobs_tenant_status_queued_at_id"] == ["tenant", "status", "queued_at", "id"]
    assert after["ix_jobs_batch_id_queued_at_id"] == ["batch_id", "queued_at", "id"]
    assert "ix_jobs_tenant_status" not in after and "ix_jobs_batch_id" not in after
    downgrade(url=url, revision="0006")
    assert _job_indexes(url) == before


@pytest.mark.services
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_0014_gives_older_jobs_the_model_that_ran_them(
    backend: str, request: pytest.FixtureRequest
) -> None:
    """A job that ran takes its worker's model; an open job that never ran takes the model
    of the latest worker (any could have run it before models were routed); the rest stay
    NULL. Down and up again."""
    from sqlalchemy import text

    url = request.getfixturevalue("sqlite_url" if backend == "sqlite" else "pg_url")
    upgrade(url=url, revision="0013")
    engine = make_engine(url=url)
    worker = ("INSERT INTO workers (id, host, model, model_id, started_at, heartbeat_at, status)"
              " VALUES (:id, 'h', :spec, :mid, :at, :at, 'stopped')")
    job = ("INSERT INTO jobs (id, tenant, queue_class, status, priority, request, queued_at, "
           "attempts, worker_id) VALUES (:id, 't', 'batch', :status, 0, '{}', "
           "'2026-01-01 00:00:00', 0, :worker)")
    with engine.begin() as conn:
        conn.execute(text(worker), [
            {"id": "w-1", "spec": "spec-a", "mid": "model-a", "at": "2026-01-01 00:00:00"},
            {"id": "w-2", "spec": "spec-b", "mid": None, "at": "2026-01-02 00:00:00"}])
        conn.execute(text(job), [
            {"id": "ran", "status": "succeeded", "worker": "w-1"},
            {"id": "running", "status": "running", "worker": "w-2"},
            {"id": "queued", "status": "queued", "worker": None},
            {"id": "cancelled", "status": "cancelled", "worker": None}])
    engine.dispose()
    upgrade(url=url)
    engine = make_engine(url=url)
    with engine.connect() as conn:
        models = dict(conn.execute(text("SELECT id, model FROM jobs")).all())
        batch_model = inspect(conn).get_columns("batches")
    engine.dispose()
    assert models == {"ran": "model-a", "running": "spec-b", "queued": "spec-b",
                      "cancelled": None}
    assert "model" in {c["name"] for c in batch_model}
    downgrade(url=url, revision="0013")
    upgrade(url=url)
