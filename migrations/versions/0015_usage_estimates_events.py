"""Usage, estimates and batch events: jobs.max_tokens, cached_tokens, engine_seconds;
batches.estimate, estimated_engine_seconds, estimated_completion_at, usage, and the batch
event delivery (callback_url, webhook_state, attempts, next_at, error, holder)

A finished job records the prompt tokens the prefix cache served and its engine-seconds
(its share of the wall time of the engine steps it computed in); ``max_tokens`` (what the
request allows, set at submission) gives a tenant's ratio of produced to allowed tokens.
An index on (tenant, finished_at) serves ``GET /v1/usage`` and that history; one on
(webhook_state, webhook_next_at) the claim of due batch events.

Revision ID: 0015
Revises: 0013
Create Date: 2026-12-10
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from worker.store.base import UTCDateTime

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("max_tokens", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("cached_tokens", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("engine_seconds", sa.Float(), nullable=True))
        batch.create_index("ix_jobs_tenant_finished_at", ["tenant", "finished_at"])
    with op.batch_alter_table("batches") as batch:
        batch.add_column(sa.Column("estimate", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("estimated_engine_seconds", sa.Float(), nullable=True))
        batch.add_column(sa.Column("estimated_completion_at", UTCDateTime(), nullable=True))
        batch.add_column(sa.Column("usage", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("callback_url", sa.String(length=2048), nullable=True))
        batch.add_column(sa.Column("webhook_state", sa.String(length=16), nullable=False,
                                   server_default="none"))
        batch.add_column(sa.Column("webhook_attempts", sa.Integer(), nullable=False,
                                   server_default="0"))
        batch.add_column(sa.Column("webhook_next_at", UTCDateTime(), nullable=True))
        batch.add_column(sa.Column("webhook_error", sa.Text(), nullable=True))
        batch.add_column(sa.Column("webhook_holder", sa.String(length=64), nullable=True))
        batch.create_index("ix_batches_webhook_state_webhook_next_at",
                           ["webhook_state", "webhook_next_at"])


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("batches") as batch:
        batch.drop_index("ix_batches_webhook_state_webhook_next_at")
        for name in ("webhook_holder", "webhook_error", "webhook_next_at", "webhook_attempts",
                     "webhook_state", "callback_url", "usage", "estimated_completion_at",
                     "estimated_engine_seconds", "estimate"):
            batch.drop_column(name)
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_tenant_finished_at")
        for name in ("engine_seconds", "cached_tokens", "max_tokens"):
            batch.drop_column(name)
