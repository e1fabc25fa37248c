"""Bounded batch work: batch_progress.expand_attempts and finalize_attempts

``expand_attempts`` counts the expansion runs that claimed the batch since its last
committed chunk (a chunk resets it): past ``INFLIGHT_EXPAND_MAX_ATTEMPTS`` the batch fails
with ``expansion_failed`` instead of being resumed again. ``finalize_attempts`` counts the
finalize runs that began writing its files: past ``INFLIGHT_FINALIZE_MAX_ATTEMPTS`` the
batch fails with ``finalize_failed``. So neither background task retries a batch forever.

Revision ID: 0016
Revises: 0013
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("batch_progress") as batch:
        batch.add_column(sa.Column("expand_attempts", sa.Integer(), nullable=False,
                                   server_default="0"))
        batch.add_column(sa.Column("finalize_attempts", sa.Integer(), nullable=False,
                                   server_default="0"))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("batch_progress") as batch:
        batch.drop_column("finalize_attempts")
        batch.drop_column("expand_attempts")
