"""Deadline-aware scheduling: jobs.deadline

``jobs.deadline`` is when a job's batch work is due: its batch's ``created_at +
completion_window`` (``batches.expires_at``), a ``deadline`` given on ``POST /v1/jobs``,
else ``queued_at`` + 24 h. The producers publish each batch job to the lane of its
deadline (``worker.queue.slack``), and the reconciler re-publishes it there. Open jobs of
a batch get their batch's; other rows stay NULL (interactive jobs have none; a batch-class
job without one is re-published as due 24 h after it was queued).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-12
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from worker.store.base import UTCDateTime

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("deadline", UTCDateTime(timezone=True), nullable=True))
    op.execute(
        "UPDATE jobs SET deadline = (SELECT b.expires_at FROM batches b WHERE b.id = jobs.batch_id) "
        "WHERE batch_id IS NOT NULL AND status IN ('queued', 'running')"
    )


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("deadline")
