"""API tables: api_keys, files, api_jobs, batch_progress

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import worker.store.base

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = worker.store.base.UTCDateTime()


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=True),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("revoked_at", _TS, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    op.create_index(op.f("ix_api_keys_tenant"), "api_keys", ["tenant"], unique=False)
    op.create_table(
        "files",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("purpose", sa.String(length=32), nullable=False),
        sa.Column("filename", sa.String(length=512), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("path", sa.String(length=1024), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_files")),
    )
    op.create_index(op.f("ix_files_tenant_created_at"), "files", ["tenant", "created_at"])
    op.create_table(
        "api_jobs",
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("idempotency_key", sa.String(length=255), nullable=True),
        sa.Column("body_hash", sa.String(length=64), nullable=True),
        sa.Column("callback_url", sa.String(length=2048), nullable=True),
        sa.Column("webhook_state", sa.String(length=16), nullable=False),
        sa.Column("webhook_attempts", sa.Integer(), nullable=False),
        sa.Column("webhook_next_at", _TS, nullable=True),
        sa.Column("webhook_error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_api_jobs")),
        sa.UniqueConstraint(
            "tenant", "idempotency_key", name=op.f("uq_api_jobs_tenant_idempotency_key")
        ),
    )
    op.create_index(
        op.f("ix_api_jobs_webhook_state_webhook_next_at"),
        "api_jobs",
        ["webhook_state", "webhook_next_at"],
    )
    op.create_table(
        "batch_progress",
        sa.Column("batch_id", sa.String(length=64), nullable=False),
        sa.Column("lines_read", sa.Integer(), nullable=False),
        sa.Column("invalid_lines", sa.Integer(), nullable=False),
        sa.Column("expanded", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("batch_id", name=op.f("pk_batch_progress")),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("batch_progress")
    op.drop_index(op.f("ix_api_jobs_webhook_state_webhook_next_at"), table_name="api_jobs")
    op.drop_table("api_jobs")
    op.drop_index(op.f("ix_files_tenant_created_at"), table_name="files")
    op.drop_table("files")
    op.drop_index(op.f("ix_api_keys_tenant"), table_name="api_keys")
    op.drop_table("api_keys")
