"""Isolation evidence: why a job ran apart from the normal batch

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("isolation", sa.Text(), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("isolation")
