"""Abuse hardening: read-only API keys, per-tenant webhook signing secrets

Revision ID: 0004
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import worker.store.base

revision: str = "0004"
down_revision: str | None = "0003_faults"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = worker.store.base.UTCDateTime()


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(
            sa.Column("read_only", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    op.create_table(
        "webhook_secrets",
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("secret", sa.String(length=128), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("tenant", name=op.f("pk_webhook_secrets")),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("webhook_secrets")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("read_only")
