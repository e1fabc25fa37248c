"""File expiry and batch retries: files.expires_at, batches.output_expires_after and
batches.retry_of

``files.expires_at`` (indexed) is when the retention task deletes a file (OpenAI's
``expires_after`` on upload, or its batch's ``output_expires_after`` for an output or error
file); ``batches.retry_of`` links a batch made by ``POST /v1/batches/{id}/retry`` to the
batch it re-runs.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from worker.store.base import UTCDateTime

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("files") as batch:
        batch.add_column(sa.Column("expires_at", UTCDateTime(), nullable=True))
        batch.create_index("ix_files_expires_at", ["expires_at"])
    with op.batch_alter_table("batches") as batch:
        batch.add_column(sa.Column("output_expires_after", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("retry_of", sa.String(length=64), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("batches") as batch:
        batch.drop_column("retry_of")
        batch.drop_column("output_expires_after")
    with op.batch_alter_table("files") as batch:
        batch.drop_index("ix_files_expires_at")
        batch.drop_column("expires_at")
