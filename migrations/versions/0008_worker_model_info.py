"""What each worker serves: workers.model_id, model_type, architecture, dtype, max_model_len

Written by the worker when it registers, from its built engine; ``GET /v1/models`` and
``inflight models`` read them for the workers seen within the liveness window.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("model_id", "model_type", "architecture", "dtype", "max_model_len")


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("model_id", sa.String(length=255), nullable=True))
        batch.add_column(sa.Column("model_type", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("architecture", sa.String(length=255), nullable=True))
        batch.add_column(sa.Column("dtype", sa.String(length=32), nullable=True))
        batch.add_column(sa.Column("max_model_len", sa.Integer(), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("workers") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
