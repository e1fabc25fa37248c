"""Idempotent batch creation: batches.idempotency_key and batches.request_digest

``POST /v1/batches`` with an ``Idempotency-Key`` stores the key and the SHA-256 of the
request on the batch; the unique constraint on (tenant, idempotency_key) makes two
concurrent first requests with one key create one batch (NULL keys never collide).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("batches") as batch:
        batch.add_column(sa.Column("idempotency_key", sa.String(length=255), nullable=True))
        batch.add_column(sa.Column("request_digest", sa.String(length=64), nullable=True))
        batch.create_unique_constraint(
            "uq_batches_tenant_idempotency_key", ["tenant", "idempotency_key"]
        )


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("batches") as batch:
        batch.drop_constraint("uq_batches_tenant_idempotency_key", type_="unique")
        batch.drop_column("request_digest")
        batch.drop_column("idempotency_key")
