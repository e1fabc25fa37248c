"""Indexes for the keyset job listing: ([tenant | tenant, status | batch_id,] queued_at, id)

The listing pages by ``(queued_at, id) > cursor`` (worker.store.crud.jobs.list_jobs). No
filter (the operator's ``inflight jobs --limit 0``) and each filter it takes get an index
ending in those two columns, so a page is one range scan however deep it is (without the
unfiltered one every page sorted the rest of the table: the walk grew quadratically,
benchmarks/listing_scale.py). ``ix_jobs_tenant_status`` and ``ix_jobs_batch_id`` are prefixes
of the new ones and go; the downgrade puts them back.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# name -> columns, as the naming convention (worker.store.base) names them
NEW = {
    "ix_jobs_queued_at_id": ["queued_at", "id"],
    "ix_jobs_tenant_queued_at_id": ["tenant", "queued_at", "id"],
    "ix_jobs_tenant_status_queued_at_id": ["tenant", "status", "queued_at", "id"],
    "ix_jobs_batch_id_queued_at_id": ["batch_id", "queued_at", "id"],
}
REPLACED = {
    "ix_jobs_tenant_status": ["tenant", "status"],
    "ix_jobs_batch_id": ["batch_id"],
}


def _swap(create: dict[str, list[str]], drop: dict[str, list[str]]) -> None:
    """Create ``create`` before dropping ``drop``: the table is never without an index for
    the queries both serve."""
    for name, columns in create.items():
        op.create_index(op.f(name), "jobs", columns, unique=False)
    for name in drop:
        op.drop_index(op.f(name), table_name="jobs")


def upgrade() -> None:
    """Apply this revision."""
    _swap(NEW, REPLACED)


def downgrade() -> None:
    """Revert this revision."""
    _swap(REPLACED, NEW)
