"""Fault tolerance: expansion lease on batch_progress, durable cancel request on jobs

Revision ID: 0003_faults
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import worker.store.base

revision: str = "0003_faults"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = worker.store.base.UTCDateTime()


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("batch_progress") as t:
        t.add_column(sa.Column("lease_owner", sa.String(length=128), nullable=True))
        t.add_column(sa.Column("lease_until", _TS, nullable=True))
    with op.batch_alter_table("jobs") as t:
        t.add_column(sa.Column("cancel_requested_at", _TS, nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("jobs") as t:
        t.drop_column("cancel_requested_at")
    with op.batch_alter_table("batch_progress") as t:
        t.drop_column("lease_until")
        t.drop_column("lease_owner")
