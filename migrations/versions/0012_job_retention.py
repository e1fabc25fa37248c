"""Job retention: jobs.result_expired_at and the indexes the retention task walks

``jobs.result_expired_at`` is when the retention task cleared a finished job's request body
and result (text, choices, error detail), keeping its accounting; null while they are
stored. The index on (result_expired_at, finished_at) finds the jobs whose result is due,
the one on finished_at the rows due for deletion, each a range scan however many rows
wait past their cutoff.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-08
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from worker.store.base import UTCDateTime

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("result_expired_at", UTCDateTime(), nullable=True))
        batch.create_index("ix_jobs_result_expired_at_finished_at",
                           ["result_expired_at", "finished_at"])
        batch.create_index("ix_jobs_finished_at", ["finished_at"])


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_finished_at")
        batch.drop_index("ix_jobs_result_expired_at_finished_at")
        batch.drop_column("result_expired_at")
