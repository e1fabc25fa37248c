"""Interjected steps in the iterations table: paused_ms

A long step's forward pauses between two layers to run a step of newly arrived interactive
requests (``LLMEngine.interjected_step``), which gets its own row; ``paused_ms`` is how
long the long step waited for such steps, left out of its ``forward_ms``. Null on rows
written before this revision.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("iterations") as batch:
        batch.add_column(sa.Column("paused_ms", sa.Float(), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("iterations") as batch:
        batch.drop_column("paused_ms")
