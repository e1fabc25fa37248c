"""Webhook delivery leases: api_jobs.webhook_holder

The claimer delivering a webhook writes its holder id here (``webhook_next_at`` is then
the lease's expiry) and records the attempt only while it still holds the lease, so a
delivery that outlived its lease cannot overwrite the claimer that took it over.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("api_jobs") as batch:
        batch.add_column(sa.Column("webhook_holder", sa.String(length=64), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("api_jobs") as batch:
        batch.drop_column("webhook_holder")
